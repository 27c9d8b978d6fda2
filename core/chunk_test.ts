import assert from "node:assert/strict";
import { DIGEST, HANDOFF_ID, header } from "./_test_fixtures.ts";
import { type BindingContext, newBindingKey } from "./binding.ts";
import { utf8 } from "./bytes.ts";
import {
  type ChunkHeader,
  computeChunkTag,
  payloadChecksum,
  validateChunkHeader,
  verifyChunkPayload,
  verifyChunkTag,
} from "./chunk.ts";
import { StateValidationError } from "./errors.ts";
import { resolveStateBounds } from "./schema.ts";

function rejects(raw: unknown, pattern: RegExp, bounds = resolveStateBounds()) {
  assert.throws(() => validateChunkHeader(raw, bounds), (e: unknown) => {
    assert.ok(e instanceof StateValidationError, String(e));
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("validateChunkHeader() accepts a well-formed KV page and returns it typed", () => {
  const h = header();
  assert.equal(validateChunkHeader(h), h);
});

Deno.test("validateChunkHeader() names the component and range when a token rule is broken", () => {
  rejects(
    header({ kind: "conv", codec: "llama-recurrent-rows", dtype: "f32", tokenRange: [5, 10] }),
    /chunk 0 \(conv\): token range does not fit rule "prefix"/,
  );
  rejects(
    header({
      kind: "first-token",
      layerRange: [0, 0],
      codec: "i32-le",
      dtype: "i32",
      tokenRange: [4, 6],
      payloadBytes: 8,
    }),
    /first-token.*"next"/,
  );
  rejects(header({ tokenRange: [512, 512] }), /kv-page\): token range/);
});

Deno.test("validateChunkHeader() refuses a payload over chunkPayloadBytesMax", () => {
  const bounds = resolveStateBounds({ chunkPayloadBytesMax: 1024 });
  rejects(
    header({ payloadBytes: 4096 }),
    /chunk 0 \(kv-page layers \[0, 6\) tokens \[0, 512\)\): payload of 4096 bytes exceeds chunkPayloadBytesMax 1024/,
    bounds,
  );
});

Deno.test("validateChunkHeader() applies kind-specific layer, codec, dtype and size rules", () => {
  rejects(
    header({ kind: "history", codec: "i32-le", dtype: "i32", payloadBytes: 2048 }),
    /layer range must be \[0, 0\)/,
  );
  rejects(header({ layerRange: [3, 3] }), /non-empty range/);
  rejects(header({ codec: "msgpack" }), /codec "msgpack" is not one of llama-kv-cells/);
  rejects(header({ dtype: "f16" }), /dtype "f16" not allowed for kv-page/);
  rejects(
    header({
      kind: "history",
      layerRange: [0, 0],
      codec: "i32-le",
      dtype: "i32",
      payloadBytes: 100,
    }),
    /expected 4 per token/,
  );
  rejects(
    header({
      kind: "sampler",
      layerRange: [0, 0],
      codec: "msgpack",
      dtype: "none",
      payloadBytes: 1 << 20,
    }),
    /metaBytesMax/,
  );
  rejects(
    header({
      kind: "mtp-hidden",
      layerRange: [0, 0],
      tokenRange: [511, 512],
      codec: "f32-rows",
      dtype: "f32",
      payloadBytes: 6,
    }),
    /whole number of f32 values/,
  );
});

Deno.test("validateChunkHeader() refuses unknown kinds, schema versions and bad fields", () => {
  rejects(header({ kind: "weights" as never }), /unknown kind "weights"/);
  rejects(header({ schemaVersion: 99 }), /unsupported state schema version 99/);
  rejects(header({ identityDigest: "abc" }), /identity digest/);
  rejects(header({ checksum: "XYZ" }), /checksum/);
  rejects(header({ handoffId: "" }), /handoff id/);
  rejects(header({ handoffId: "x".repeat(500) }), /handoff id/);
  rejects(header({ positionConfig: { seqId: -1, nPosPerToken: 1 } }), /position configuration/);
  rejects(header({ positionConfig: { seqId: 0, nPosPerToken: 3 } }), /position configuration/);
  rejects(header({ final: "yes" as never }), /final marker/);
  rejects(header({ seq: -1 }), /sequence number -1/);
});

Deno.test("validateChunkHeader() never crashes on garbage input", () => {
  const samples: unknown[] = [null, undefined, 0, "x", [], {}, { seq: 0 }, {
    seq: 0,
    kind: "kv-page",
  }];
  for (const field of Object.keys(header())) {
    for (const bad of [null, undefined, -1, 1.5, "x", [], {}, [1], [2, 1], [0, 1e300], NaN]) {
      samples.push({ ...header(), [field]: bad });
    }
  }
  for (const raw of samples) {
    try {
      validateChunkHeader(raw);
    } catch (e) {
      assert.ok(e instanceof StateValidationError, `${JSON.stringify(raw)}: ${e}`);
    }
  }
});

Deno.test("verifyChunkPayload() detects size and checksum mismatches without printing checksums", () => {
  const payload = utf8("attention kv rows");
  const h = header({ payloadBytes: payload.length, checksum: payloadChecksum(payload) });
  verifyChunkPayload(h, payload);
  assert.throws(() => verifyChunkPayload(h, payload.subarray(1)), /size mismatch/);
  const corrupted = payload.slice();
  corrupted[3] ^= 0x40;
  assert.throws(() => verifyChunkPayload(h, corrupted), (e: unknown) => {
    assert.ok(e instanceof StateValidationError);
    assert.match(
      e.message,
      /chunk 0 \(kv-page layers \[0, 6\) tokens \[0, 512\)\): checksum mismatch/,
    );
    assert.ok(!e.message.includes(h.checksum.slice(0, 8)));
    return true;
  });
});

function binding(overrides: Partial<BindingContext> = {}): BindingContext {
  return {
    bindingKey: KEY,
    handoffId: HANDOFF_ID,
    destNodeId: "node-m1",
    tenantId: "tenant-a",
    ...overrides,
  };
}
const KEY = newBindingKey();

Deno.test("a chunk tag verifies only for its own handoff, destination, tenant and key", async () => {
  const h = header();
  const tag = await computeChunkTag(binding(), h);
  assert.match(tag, /^[0-9a-f]{64}$/);
  assert.equal(await verifyChunkTag(binding(), h, tag), true);
  assert.equal(await verifyChunkTag(binding({ destNodeId: "node-other" }), h, tag), false);
  assert.equal(await verifyChunkTag(binding({ tenantId: "tenant-b" }), h, tag), false);
  assert.equal(await verifyChunkTag(binding({ bindingKey: newBindingKey() }), h, tag), false);
  // Cross-handoff: the same bytes presented under another handoff's reservation.
  const other = binding({ handoffId: "h-0002" });
  assert.equal(await verifyChunkTag(other, { ...h, handoffId: "h-0002" }, tag), false);
  assert.equal(await verifyChunkTag(other, h, tag), false);
  assert.equal(await verifyChunkTag(binding(), h, "not-hex"), false);
});

Deno.test("a chunk tag fails when any header field changes", async () => {
  const h = header();
  const tag = await computeChunkTag(binding(), h);
  const variants: Partial<ChunkHeader>[] = [
    { seq: 1 },
    { final: true },
    { tokenRange: [0, 511] },
    { layerRange: [0, 5] },
    { payloadBytes: h.payloadBytes + 1 },
    { checksum: "00".repeat(32) },
    { identityDigest: "cd".repeat(32) },
    { dtype: "q8_0/q8_0" },
    { positionConfig: { seqId: 1, nPosPerToken: 1 } },
  ];
  for (const v of variants) {
    assert.equal(await verifyChunkTag(binding(), { ...h, ...v }, tag), false, JSON.stringify(v));
  }
  assert.equal(h.identityDigest, DIGEST);
});
