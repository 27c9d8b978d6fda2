import assert from "node:assert/strict";
import { UsageError } from "./errors.ts";
import {
  COMPONENT_KINDS,
  componentRule,
  DEFAULT_STATE_BOUNDS,
  describeComponent,
  dtypeAllowed,
  firstTilingFault,
  MODEL_FAMILIES,
  requiredComponents,
  resolveStateBounds,
} from "./schema.ts";

Deno.test("requiredComponents() lists each family's state kinds plus the logical kinds", () => {
  const logical = ["positions", "sampler", "history", "first-token"];
  assert.deepEqual(requiredComponents("dense"), ["kv-page", ...logical]);
  assert.deepEqual(requiredComponents("iswa"), ["kv-page", "swa-kv", ...logical]);
  assert.deepEqual(requiredComponents("recurrent"), ["conv", "ssm", ...logical]);
  assert.deepEqual(requiredComponents("hybrid"), ["kv-page", "conv", "ssm", ...logical]);
  assert.deepEqual(requiredComponents("hybrid-moe-mtp"), [
    "kv-page",
    "conv",
    "ssm",
    "mtp-kv",
    "mtp-hidden",
    ...logical,
  ]);
});

Deno.test("every component kind has a rule with at least one codec and one dtype", () => {
  for (const kind of COMPONENT_KINDS) {
    const rule = componentRule(kind);
    assert.equal(rule.kind, kind);
    assert.ok(rule.codecs.length > 0);
    assert.ok(rule.dtypes === "kv" || rule.dtypes.length > 0);
  }
  for (const family of MODEL_FAMILIES) assert.ok(requiredComponents(family).length >= 5);
});

Deno.test("KV and MTP KV pages stream; recurrent, SWA and the MTP row travel after the pages", () => {
  assert.equal(componentRule("kv-page").order, "paged");
  assert.equal(componentRule("mtp-kv").order, "paged");
  for (const kind of ["swa-kv", "conv", "ssm", "mtp-hidden"] as const) {
    assert.equal(componentRule(kind).order, "after-pages", kind);
  }
});

Deno.test("resolveStateBounds() refuses non-positive bounds and a chunk larger than the state", () => {
  assert.throws(() => resolveStateBounds({ chunkPayloadBytesMax: 0 }), UsageError);
  assert.throws(() => resolveStateBounds({ stateBytesMax: 1.5 }), UsageError);
  assert.throws(
    () => resolveStateBounds({ chunkPayloadBytesMax: 1024, stateBytesMax: 512 }),
    UsageError,
  );
  assert.equal(resolveStateBounds({ chunksMax: 10 }).chunksMax, 10);
});

Deno.test("default bounds allow states far beyond one 512 MiB buffer, in bounded chunks", () => {
  const mib = 1024 * 1024;
  assert.ok(DEFAULT_STATE_BOUNDS.stateBytesMax > 512 * mib);
  assert.ok(DEFAULT_STATE_BOUNDS.chunkPayloadBytesMax <= 64 * mib);
});

Deno.test("firstTilingFault() reports gaps, overlaps and overshoot", () => {
  assert.equal(firstTilingFault([[0, 4], [4, 8]], 8), null);
  assert.deepEqual(firstTilingFault([[0, 4], [6, 8]], 8), { fault: "gap", range: [4, 6] });
  assert.deepEqual(firstTilingFault([[0, 4]], 8), { fault: "gap", range: [4, 8] });
  assert.deepEqual(firstTilingFault([[0, 4], [2, 8]], 8), { fault: "overlap", range: [2, 4] });
  assert.deepEqual(firstTilingFault([[0, 10]], 8), { fault: "overlap", range: [8, 10] });
  assert.deepEqual(firstTilingFault([], 0), null);
});

Deno.test("describeComponent() names layers only for layered kinds", () => {
  assert.equal(
    describeComponent("kv-page", [0, 8], [2048, 4096]),
    "kv-page layers [0, 8) tokens [2048, 4096)",
  );
  assert.equal(describeComponent("history", [0, 0], [0, 10]), "history tokens [0, 10)");
});

Deno.test("dtypeAllowed() wants a K/V pair for KV kinds and f32 for SSM state", () => {
  assert.equal(dtypeAllowed("kv-page", "f16/q8_0"), true);
  assert.equal(dtypeAllowed("kv-page", "f16"), false);
  assert.equal(dtypeAllowed("kv-page", "f16/xx"), false);
  assert.equal(dtypeAllowed("ssm", "f32"), true);
  assert.equal(dtypeAllowed("ssm", "f16"), false);
});
