import assert from "node:assert/strict";
import {
  completeStream,
  DIGEST,
  fakeChecksum,
  HANDOFF_ID,
  header,
  OTHER_DIGEST,
  streamBytes,
} from "./_test_fixtures.ts";
import type { ChunkHeader } from "./chunk.ts";
import { IdentityMismatchError, LimitExceededError, StateValidationError } from "./errors.ts";
import { StagingLedger } from "./ledger.ts";
import { buildManifest, componentOf, type FinalManifest } from "./manifest.ts";
import { type ModelFamily, STATE_SCHEMA_VERSION } from "./schema.ts";

const TAG = "ee".repeat(32);

function ledger(family: ModelFamily = "hybrid", creditBytes = 1 << 30): StagingLedger {
  return new StagingLedger({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family,
    trunkLayers: 6,
    creditBytes,
  });
}

function manifestOf(stream: readonly ChunkHeader[], family: ModelFamily, n: number): FinalManifest {
  const unsigned = buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family,
    components: stream.map(componentOf),
    logical: { position: n, tokenCount: n },
  });
  return { ...unsigned, tag: TAG };
}

function rejects(l: StagingLedger, h: ChunkHeader, type: unknown, pattern: RegExp): void {
  assert.throws(() => l.accept(h), (e: unknown) => {
    assert.ok(e instanceof (type as typeof Error), `${e}`);
    assert.match((e as Error).message, pattern);
    return true;
  });
}

Deno.test("a complete stream of every family verifies against its manifest", () => {
  for (const family of ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"] as const) {
    const stream = completeStream(family, 2000);
    const l = ledger(family);
    for (const h of stream) l.accept(h);
    assert.equal(l.finalSeen, true);
    assert.equal(l.receivedBytes, streamBytes(stream));
    assert.deepEqual(l.verifyAgainst(manifestOf(stream, family, 2000)), { ok: true }, family);
  }
});

Deno.test("accept() rejects a duplicated (replayed) chunk", () => {
  const [a] = completeStream("hybrid", 1024);
  const l = ledger();
  l.accept(a);
  rejects(
    l,
    a,
    StateValidationError,
    /chunk 0 \(kv-page layers \[0, 6\) tokens \[0, 512\)\): duplicate or replayed chunk/,
  );
});

Deno.test("accept() rejects a sequence number that skips ahead", () => {
  const stream = completeStream("hybrid", 1024);
  const l = ledger();
  l.accept(stream[0]);
  rejects(l, stream[2], StateValidationError, /out of order, expected chunk 1/);
});

Deno.test("accept() rejects a page that skips tokens, naming the missing range", () => {
  const l = ledger();
  l.accept(header({ tokenRange: [0, 2048], seq: 0 }));
  rejects(
    l,
    header({ tokenRange: [4096, 6144], seq: 1 }),
    StateValidationError,
    /kv-page layers \[0, 6\) tokens \[2048, 4096\) missing \(pages must arrive in token order\)/,
  );
  rejects(
    ledger(),
    header({ tokenRange: [512, 1024] }),
    StateValidationError,
    /tokens \[0, 512\) missing/,
  );
});

Deno.test("accept() rejects overlapping pages and overlapping layer lanes", () => {
  const l = ledger();
  l.accept(header({ tokenRange: [0, 512] }));
  rejects(
    l,
    header({ tokenRange: [256, 768], seq: 1 }),
    StateValidationError,
    /overlaps tokens \[256, 512\) already staged/,
  );
  const m = ledger();
  m.accept(header({ layerRange: [0, 3] }));
  rejects(
    m,
    header({ layerRange: [2, 6], seq: 1 }),
    StateValidationError,
    /layers overlap pages of layers \[0, 3\)/,
  );
});

Deno.test("accept() rejects a KV page past the position the recurrent snapshot fixed", () => {
  const stream = completeStream("hybrid", 1024);
  const l = ledger();
  for (const h of stream.slice(0, 3)) l.accept(h); // 2 pages + conv
  assert.equal(stream[2].kind, "conv");
  rejects(
    l,
    header({ tokenRange: [1024, 1536], seq: 3 }),
    StateValidationError,
    /lies past the snapshot position 1024/,
  );
});

Deno.test("accept() rejects a snapshot that does not describe the last page position", () => {
  const stream = completeStream("hybrid", 1024);
  const l = ledger();
  l.accept(stream[0]);
  l.accept(stream[1]);
  const conv = { ...stream[2], tokenRange: [0, 900] as const };
  rejects(
    l,
    conv,
    StateValidationError,
    /conv layers \[0, 6\) tokens \[0, 900\)\): does not match the last page position 1024/,
  );
});

Deno.test("accept() rejects a second conv for the same layers", () => {
  const stream = completeStream("hybrid", 512);
  const l = ledger();
  l.accept(stream[0]);
  l.accept(stream[1]);
  rejects(
    l,
    { ...stream[1], seq: 2, layerRange: [4, 6] },
    StateValidationError,
    /duplicate conv for layers \[0, 6\)/,
  );
});

Deno.test("accept() rejects chunks of another handoff, identity, schema or family", () => {
  rejects(
    ledger(),
    header({ handoffId: "h-other" }),
    StateValidationError,
    /belongs to another handoff/,
  );
  rejects(
    ledger(),
    header({ identityDigest: OTHER_DIGEST }),
    IdentityMismatchError,
    /different numerical identity/,
  );
  rejects(
    ledger(),
    header({ schemaVersion: 1 }),
    StateValidationError,
    new RegExp(`schema version 1, expected ${STATE_SCHEMA_VERSION}`),
  );
  const conv = completeStream("hybrid", 512)[1];
  rejects(
    ledger("dense"),
    { ...conv, seq: 0 },
    StateValidationError,
    /not a component of family "dense"/,
  );
});

Deno.test("accept() refuses bytes beyond the credit granted", () => {
  const l = ledger("hybrid", 40_000);
  l.accept(header({ payloadBytes: 32_768 }));
  rejects(
    l,
    header({ tokenRange: [512, 1024], payloadBytes: 32_768, seq: 1 }),
    LimitExceededError,
    /65536 bytes exceed the 40000 bytes of credit granted/,
  );
  const m = ledger("hybrid", 40_000);
  m.accept(header({ payloadBytes: 32_768 }));
  m.grantCredit(32_768);
  m.accept(header({ tokenRange: [512, 1024], payloadBytes: 32_768, seq: 1 }));
  assert.equal(m.creditBytes, 72_768);
});

Deno.test("a rejected chunk poisons the ledger: nothing is accepted and verify never passes", () => {
  const stream = completeStream("hybrid", 1024);
  const l = ledger();
  l.accept(stream[0]);
  assert.throws(() => l.accept(stream[0]));
  assert.ok(l.failure instanceof StateValidationError);
  assert.throws(() => l.accept(stream[1]), /duplicate or replayed/);
  const verdict = l.verifyAgainst(manifestOf(stream, "hybrid", 1024));
  assert.equal(verdict.ok, false);
  assert.match(!verdict.ok ? verdict.error.message : "", /a chunk was rejected earlier/);
});

Deno.test("verifyAgainst() reports a stream without its final chunk", () => {
  const stream = completeStream("hybrid", 1024);
  const l = ledger();
  for (const h of stream.slice(0, -1)) l.accept(h);
  const v = l.verifyAgainst(manifestOf(stream, "hybrid", 1024));
  assert.match(!v.ok ? v.error.message : "", /the final chunk has not arrived/);
});

Deno.test("verifyAgainst() reports a checksum mismatch by component, never the value", () => {
  const stream = completeStream("hybrid", 1024);
  const l = ledger();
  for (const h of stream) l.accept(h);
  const m = manifestOf(stream, "hybrid", 1024);
  const tampered = {
    ...m,
    components: m.components.map((c) =>
      c.kind === "conv" ? { ...c, checksum: fakeChecksum(99) } : c
    ),
  };
  const v = l.verifyAgainst(tampered);
  assert.equal(v.ok, false);
  const message = !v.ok ? v.error.message : "";
  assert.match(message, /conv layers \[0, 6\) tokens \[0, 1024\) checksum mismatch/);
  assert.ok(!message.includes(fakeChecksum(99)) && !message.includes("0000000"));
});

Deno.test("verifyAgainst() names a page the manifest lists but the stream never carried", () => {
  const n = 1536;
  const stream = completeStream("hybrid", n);
  const l = ledger();
  for (const h of stream) l.accept(h);
  // The manifest claims a longer prompt than what was staged.
  const m = manifestOf(completeStream("hybrid", 2048), "hybrid", 2048);
  const v = l.verifyAgainst(m);
  assert.match(
    !v.ok ? v.error.message : "",
    /kv-page layers \[0, 6\) tokens \[1536, 2048\) missing/,
  );
});

Deno.test("verifyAgainst() refuses a manifest of another handoff or family", () => {
  const stream = completeStream("hybrid", 512);
  const l = ledger();
  for (const h of stream) l.accept(h);
  const m = manifestOf(stream, "hybrid", 512);
  assert.equal(l.verifyAgainst({ ...m, handoffId: "h-other" }).ok, false);
  assert.equal(l.verifyAgainst({ ...m, identityDigest: OTHER_DIGEST }).ok, false);
  assert.equal(l.verifyAgainst({ ...m, family: "dense" }).ok, false);
  assert.equal(l.verifyAgainst({ ...m, verify: ["identity"] }).ok, false);
});

Deno.test("a recurrent-only stream fixes the position from its first snapshot", () => {
  const stream = completeStream("recurrent", 700);
  const l = ledger("recurrent");
  for (const h of stream) l.accept(h);
  assert.deepEqual(l.verifyAgainst(manifestOf(stream, "recurrent", 700)), { ok: true });
  const m = ledger("recurrent");
  m.accept(stream[0]);
  rejects(
    m,
    { ...stream[1], tokenRange: [0, 699] },
    StateValidationError,
    /does not match the last page position 700/,
  );
});

Deno.test("accept() refuses anything after the final chunk", () => {
  const stream = completeStream("dense", 512);
  const l = ledger("dense");
  for (const h of stream) l.accept(h);
  rejects(
    l,
    header({ tokenRange: [512, 1024], seq: stream.length }),
    StateValidationError,
    /after the final chunk/,
  );
});

Deno.test("recurrent runs may arrive while the last chunk computes, before its pages", () => {
  // What the prefiller sends with layer capture: conv and ssm of [0, 1024) between the page
  // of [0, 512) and the page of [512, 1024).
  const stream = completeStream("hybrid", 1024);
  const [p0, p1, conv, ssm, ...rest] = stream;
  assert.deepEqual([p0.kind, p1.kind, conv.kind, ssm.kind], ["kv-page", "kv-page", "conv", "ssm"]);
  const early = [p0, conv, ssm, p1, ...rest].map((h, seq) => ({
    ...h,
    seq,
    final: seq === stream.length - 1,
  }));
  const l = ledger();
  for (const h of early) l.accept(h);
  assert.deepEqual(l.verifyAgainst(manifestOf(early, "hybrid", 1024)), { ok: true });
});
