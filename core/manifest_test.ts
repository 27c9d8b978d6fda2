import assert from "node:assert/strict";
import { completeStream, DIGEST, HANDOFF_ID } from "./_test_fixtures.ts";
import { type BindingContext, newBindingKey } from "./binding.ts";
import { StateValidationError } from "./errors.ts";
import {
  buildManifest,
  componentOf,
  type FinalManifest,
  findIncompleteness,
  mandatoryVerifySteps,
  manifestStateBytes,
  type UnsignedManifest,
  validateManifest,
} from "./manifest.ts";
import {
  canonicalManifestBytes,
  openManifest,
  sealManifest,
  signProbeDigest,
  verifyProbeDigest,
} from "./manifest_tags.ts";
import type { ModelFamily } from "./schema.ts";

/** The signed manifest `sealManifest` makes. */
async function sign(m: UnsignedManifest, binding: BindingContext): Promise<FinalManifest> {
  return (await sealManifest(m, binding)).manifest;
}

/** True when the manifest's tag verifies over its canonical bytes, as the decoder checks it. */
async function verifies(m: FinalManifest, binding: BindingContext): Promise<boolean> {
  return await openManifest(canonicalManifestBytes(m), m.tag, binding) !== null;
}

function unsigned(family: ModelFamily = "hybrid", n = 2048): UnsignedManifest {
  return buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family,
    components: completeStream(family, n).map(componentOf),
    logical: { position: n, tokenCount: n },
  });
}

const ctx: BindingContext = {
  bindingKey: newBindingKey(),
  handoffId: HANDOFF_ID,
  destNodeId: "node-m1",
  tenantId: "tenant-a",
};

Deno.test("buildManifest() always lists the family's mandatory verify steps", () => {
  assert.deepEqual(unsigned("hybrid").verify, [
    "identity",
    "binding-tag",
    "components-complete",
    "checksums",
    "kv-contiguous",
    "recurrent-position",
  ]);
  const withProbe = buildManifest({ ...unsigned("dense"), verify: ["continuation-probe"] });
  assert.deepEqual(withProbe.verify, [...mandatoryVerifySteps("dense"), "continuation-probe"]);
  assert.ok(mandatoryVerifySteps("hybrid-moe-mtp").includes("mtp-ready"));
});

Deno.test("a signed manifest verifies; a changed component, destination or tenant fails", async () => {
  const m = await sign(unsigned(), ctx);
  assert.equal(await verifies(m, ctx), true);
  const changed: FinalManifest = {
    ...m,
    components: m.components.map((c, i) => i === 0 ? { ...c, bytes: c.bytes + 1 } : c),
  };
  assert.equal(await verifies(changed, ctx), false);
  assert.equal(
    await verifies({ ...m, logical: { position: 2047, tokenCount: 2047 } }, ctx),
    false,
  );
  assert.equal(await verifies(m, { ...ctx, destNodeId: "node-other" }), false);
  assert.equal(await verifies(m, { ...ctx, tenantId: "tenant-b" }), false);
});

Deno.test("a sealed manifest opens from its bytes; changed bytes, another tenant or tag do not", async () => {
  const { manifest, bytes } = await sealManifest(unsigned(), ctx);
  const opened = validateManifest(await openManifest(bytes, manifest.tag, ctx), {
    trunkLayers: 6,
  });
  assert.deepEqual(opened, manifest);
  assert.equal(await verifies(opened, ctx), true);
  const flipped = bytes.slice();
  flipped[flipped.length >> 1] ^= 1;
  assert.equal(await openManifest(flipped, manifest.tag, ctx), null);
  assert.equal(await openManifest(bytes, manifest.tag, { ...ctx, tenantId: "tenant-b" }), null);
  assert.equal(await openManifest(bytes, "00".repeat(32), ctx), null);
  assert.equal(await openManifest(bytes, undefined, ctx), null);
});

Deno.test("validateManifest() accepts a complete manifest of every family", async () => {
  for (const family of ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"] as const) {
    const m = await sign(unsigned(family), ctx);
    assert.equal(validateManifest(m, { trunkLayers: 6 }), m);
    assert.ok(manifestStateBytes(m) > 0);
  }
});

Deno.test("validateManifest() refuses a verify list lacking a mandatory step", async () => {
  const m = await sign(unsigned(), ctx);
  assert.throws(
    () =>
      validateManifest({ ...m, verify: m.verify.filter((s) => s !== "checksums") }, {
        trunkLayers: 6,
      }),
    /verify list lacks mandatory step "checksums"/,
  );
});

Deno.test("validateManifest() never crashes on garbage and refuses it with StateValidationError", async () => {
  const m = await sign(unsigned(), ctx);
  const samples: unknown[] = [null, 1, "x", {}, []];
  for (const field of Object.keys(m)) {
    for (const bad of [null, -1, "x", [], {}, [{}], { position: 0, tokenCount: 0 }]) {
      samples.push({ ...m, [field]: bad });
    }
  }
  let refused = 0;
  for (const raw of samples) {
    try {
      validateManifest(raw, { trunkLayers: 6 });
    } catch (e) {
      assert.ok(e instanceof StateValidationError, `${JSON.stringify(raw)}: ${e}`);
      refused++;
    }
  }
  // Among the garbage only a handoff id of "x" still makes a valid manifest.
  assert.equal(refused, samples.length - 1);
});

Deno.test("findIncompleteness() names the missing KV token range", () => {
  const m = unsigned("hybrid", 4096);
  const holed = {
    ...m,
    components: m.components.filter((c) => !(c.kind === "kv-page" && c.tokenRange[0] === 2048)),
  };
  const error = findIncompleteness(holed, 6);
  assert.ok(error instanceof StateValidationError);
  assert.match(error.message, /kv-page layers \[0, 6\) tokens \[2048, 2560\) missing/);
  const short = {
    ...m,
    components: m.components.filter((c) => !(c.kind === "kv-page" && c.tokenRange[0] >= 3584)),
  };
  assert.match(
    findIncompleteness(short, 6)!.message,
    /kv-page layers \[0, 6\) tokens \[3584, 4096\) missing/,
  );
});

Deno.test("findIncompleteness() reports a missing conv and a duplicated page", () => {
  const m = unsigned("hybrid", 1024);
  assert.match(
    findIncompleteness({ ...m, components: m.components.filter((c) => c.kind !== "conv") }, 6)!
      .message,
    /conv missing/,
  );
  const dup = { ...m, components: [...m.components, m.components[0]] };
  assert.match(findIncompleteness(dup, 6)!.message, /tokens \[0, 512\) duplicated/);
});

Deno.test("findIncompleteness() rejects components foreign to the family", () => {
  const m = unsigned("dense", 1024);
  const conv = unsigned("hybrid", 1024).components.find((c) => c.kind === "conv")!;
  assert.match(
    findIncompleteness({ ...m, components: [...m.components, conv] }, 6)!.message,
    /unexpected conv component for family "dense"/,
  );
});

Deno.test("findIncompleteness() accepts KV pages from layer-split stages that tile the trunk", () => {
  const m = unsigned("dense", 1024);
  const pages = m.components.filter((c) => c.kind === "kv-page");
  const rest = m.components.filter((c) => c.kind !== "kv-page");
  const split = pages.flatMap((
    p,
  ) => [{ ...p, layerRange: [0, 2] as const }, { ...p, layerRange: [2, 6] as const }]);
  assert.equal(findIncompleteness({ ...m, components: [...split, ...rest] }, 6), null);
  const gap = pages.map((p) => ({ ...p, layerRange: [0, 2] as const }));
  assert.match(
    findIncompleteness({ ...m, components: [...gap, ...rest] }, 6)!.message,
    /kv-page layers \[2, 6\) missing/,
  );
});

Deno.test("findIncompleteness() checks the first token sits right after the prompt", () => {
  const m = unsigned("dense", 1024);
  const moved = m.components.map((c) =>
    c.kind === "first-token" ? { ...c, tokenRange: [1023, 1024] as const } : c
  );
  assert.match(
    findIncompleteness({ ...m, components: moved }, 6)!.message,
    /first-token covers tokens \[1023, 1024\), expected \[1024, 1025\)/,
  );
});

Deno.test("the continuation probe digest is covered by the manifest tag", async () => {
  const withProbe = buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family: "hybrid",
    components: completeStream("hybrid", 1024).map(componentOf),
    logical: { position: 1024, tokenCount: 1024 },
    probe: { logitsSha256: "ab".repeat(32) },
  });
  assert.ok(withProbe.verify.includes("continuation-probe"));
  const binding: BindingContext = {
    bindingKey: newBindingKey(),
    handoffId: HANDOFF_ID,
    destNodeId: "node-b",
    tenantId: "t",
  };
  const signed = await sign(withProbe, binding);
  validateManifest(signed, { trunkLayers: 6 });
  assert.ok(await verifies(signed, binding));
  const tampered = { ...signed, probe: { logitsSha256: "cd".repeat(32) } };
  assert.equal(await verifies(tampered, binding), false);
  const { probe: _dropped, ...withoutProbe } = signed;
  assert.throws(() => validateManifest(withoutProbe, { trunkLayers: 6 }), StateValidationError);
});

Deno.test("a probe digest that follows the manifest: announced by a signed null, bound to the reservation", async () => {
  const follows = buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family: "hybrid",
    components: completeStream("hybrid", 1024).map(componentOf),
    logical: { position: 1024, tokenCount: 1024 },
    probe: { logitsSha256: null },
  });
  assert.ok(follows.verify.includes("continuation-probe"));
  const binding: BindingContext = {
    bindingKey: newBindingKey(),
    handoffId: HANDOFF_ID,
    destNodeId: "node-b",
    tenantId: "t",
  };
  const signed = await sign(follows, binding);
  validateManifest(signed, { trunkLayers: 6 });
  // The announcement is signed: an inline digest cannot be swapped in for it.
  const swapped = { ...signed, probe: { logitsSha256: "ab".repeat(32) } };
  assert.equal(await verifies(swapped, binding), false);
  const digest = "ab".repeat(32);
  const tag = await signProbeDigest(binding, digest);
  assert.ok(await verifyProbeDigest(binding, digest, tag));
  assert.equal(await verifyProbeDigest(binding, "cd".repeat(32), tag), false);
  const otherReservation = { ...binding, bindingKey: newBindingKey() };
  assert.equal(await verifyProbeDigest(otherReservation, digest, tag), false);
  assert.equal(await verifyProbeDigest({ ...binding, destNodeId: "node-c" }, digest, tag), false);
  // A manifest tag is not a probe tag (domains differ), and garbage is refused.
  assert.equal(await verifyProbeDigest(binding, digest, signed.tag), false);
  assert.equal(await verifyProbeDigest(binding, "not hex", tag), false);
  assert.equal(await verifyProbeDigest(binding, digest, 42), false);
});
