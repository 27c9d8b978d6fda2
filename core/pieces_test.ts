/**
 * Schema 3 byte pieces, with synthetic chunks: a component too large for one chunk (one
 * recurrent layer over `chunkPayloadBytesMax`, the SWA cache, a long history) travels as
 * pieces whose byte ranges tile `[0, of)` in order. Headers, the ledger and the manifest each
 * refuse a gap, an overlap, a duplicate, an out-of-order piece and a wrong size, naming the
 * bytes.
 */
import assert from "node:assert/strict";
import { completeStream, DIGEST, HANDOFF_ID, header } from "./_test_fixtures.ts";
import { canonicalHeaderBytes, type ChunkHeader, validateChunkHeader } from "./chunk.ts";
import { StateValidationError } from "./errors.ts";
import { StagingLedger } from "./ledger.ts";
import {
  buildManifest,
  componentOf,
  findIncompleteness,
  type ManifestComponent,
  validateManifest,
} from "./manifest.ts";
import { DEFAULT_STATE_BOUNDS, type ModelFamily, NO_LAYERS } from "./schema.ts";

const FAMILIES: ModelFamily[] = ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"];
const TAG = "ee".repeat(32);
const N = 2000;

function ledger(family: ModelFamily): StagingLedger {
  return new StagingLedger({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family,
    trunkLayers: 6,
    creditBytes: 1 << 30,
  });
}

function manifestOf(components: ManifestComponent[], family: ModelFamily) {
  return {
    ...buildManifest({
      handoffId: HANDOFF_ID,
      identityDigest: DIGEST,
      family,
      components,
      logical: { position: N, tokenCount: N },
    }),
    tag: TAG,
  };
}

/** `stream` with sequence numbers renumbered from 0 and the last chunk final. */
function resequenced(stream: ChunkHeader[]): ChunkHeader[] {
  return stream.map((h, seq) => ({ ...h, seq, final: seq === stream.length - 1 }));
}

function ssmPieces(stream: ChunkHeader[]): number[] {
  return stream.flatMap((h, i) => (h.kind === "ssm" && h.piece ? [i] : []));
}

Deno.test("every family: a stream cut into byte pieces is accepted and verifies", () => {
  for (const family of FAMILIES) {
    const stream = completeStream(family, N, { snapshotParts: 3, pieceBytes: 1500 });
    const pieces = stream.filter((h) => h.piece);
    // Every piece-able component over 1500 bytes was cut: the 4096-byte fixtures and history.
    assert.ok(pieces.length > 0, family);
    assert.ok(stream.every((h) => h.payloadBytes <= 1500 || !h.piece), family);
    const l = ledger(family);
    for (const h of stream) l.accept(validateChunkHeader(h));
    const m = manifestOf(stream.map(componentOf), family);
    assert.equal(findIncompleteness(m, 6), null, family);
    validateManifest(m, { trunkLayers: 6 });
    assert.deepEqual(l.verifyAgainst(m), { ok: true }, family);
  }
});

Deno.test("a piece header is refused when its range, size or kind is wrong", () => {
  const ssm = (piece: unknown, more: Partial<ChunkHeader> = {}) =>
    header({
      kind: "ssm",
      layerRange: [0, 6],
      tokenRange: [0, 512],
      codec: "llama-recurrent-rows",
      dtype: "f32",
      payloadBytes: 1000,
      piece: piece as ChunkHeader["piece"],
      ...more,
    });
  validateChunkHeader(ssm({ range: [1000, 2000], of: 4096 }));
  const refused: [unknown, RegExp, Partial<ChunkHeader>?][] = [
    [{ range: [0, 999], of: 4096 }, /payload of 1000 bytes for a piece of 999/],
    [{ range: [4000, 5000], of: 4096 }, /piece range \[4000,5000\] is not a non-empty range/],
    [{ range: [10, 10], of: 4096 }, /not a non-empty range/],
    [{ range: [0, 1000], of: 0 }, /piece size 0 is not within/],
    [{ range: [0, 1000], of: DEFAULT_STATE_BOUNDS.stateBytesMax + 4 }, /piece size \d+ is not/],
    [{ range: [0, 1000], of: "4096" }, /piece size "4096"/],
    [null, /piece size undefined/],
    [{ range: [0, 1000], of: 4098 }, /component of 4098 bytes is not a whole number of f32/],
    [{ range: [0, 1000], of: 4096 }, /kv-page does not travel in pieces/, {
      kind: "kv-page",
      codec: "llama-kv-cells",
      dtype: "f16/f16",
      payloadBytes: 1000,
      tokenRange: [0, 1000],
    }],
    [{ range: [0, 4], of: 4 }, /first-token does not travel in pieces/, {
      kind: "first-token",
      layerRange: NO_LAYERS,
      tokenRange: [512, 513],
      codec: "i32-le",
      dtype: "i32",
      payloadBytes: 4,
    }],
    // History is 4 bytes a token: the whole it is cut from must say so.
    [{ range: [0, 1000], of: 4000 }, /component of 4000 bytes, expected 4 per token/, {
      kind: "history",
      layerRange: NO_LAYERS,
      codec: "i32-le",
      dtype: "i32",
    }],
  ];
  for (const [piece, pattern, more] of refused) {
    assert.throws(() => validateChunkHeader(ssm(piece, more)), pattern, String(pattern));
  }
  // Over the metadata bound as a whole, even though each piece is small.
  assert.throws(
    () =>
      validateChunkHeader(header({
        kind: "sampler",
        layerRange: NO_LAYERS,
        codec: "msgpack",
        dtype: "none",
        payloadBytes: 100,
        piece: { range: [0, 100], of: DEFAULT_STATE_BOUNDS.metaBytesMax + 1 },
      })),
    /component of \d+ bytes exceeds metaBytesMax/,
  );
  // The binding tag covers the piece: another range is another header.
  const a = canonicalHeaderBytes(ssm({ range: [0, 1000], of: 4096 }));
  const b = canonicalHeaderBytes(ssm({ range: [1000, 2000], of: 4096 }));
  assert.notDeepEqual(a, b);
});

Deno.test("the ledger refuses a missing, duplicated, reordered or resized piece", () => {
  const stream = completeStream("hybrid", N, { snapshotParts: 2, pieceBytes: 1500 });
  const [first, second, third] = ssmPieces(stream);
  assert.equal(stream[first].piece!.range[0], 0);
  const cases: [string, ChunkHeader[], RegExp][] = [
    [
      "gap",
      resequenced(stream.filter((_, i) => i !== second)),
      /bytes \[1500, 3000\) missing \(pieces must arrive in byte order\)/,
    ],
    [
      "duplicate",
      resequenced([...stream.slice(0, third), stream[second], ...stream.slice(third)]),
      /overlaps bytes \[1500, 3000\) already staged/,
    ],
    [
      "out of order",
      resequenced([
        ...stream.slice(0, second),
        stream[third],
        stream[second],
        ...stream.slice(third + 1),
      ]),
      /bytes \[1500, 3000\) missing/,
    ],
    [
      "first piece not at 0",
      resequenced(stream.filter((_, i) => i !== first)),
      /bytes \[0, 1500\) missing/,
    ],
    [
      "another size",
      resequenced(
        stream.map((h, i) =>
          i === second ? { ...h, piece: { range: h.piece!.range, of: 8192 } } : h
        ),
      ),
      /earlier pieces cut it from 4096 bytes/,
    ],
    [
      "a whole copy after the pieces",
      resequenced([
        ...stream.slice(0, third + 1),
        { ...stream[first], piece: undefined, payloadBytes: 4096 },
        ...stream.slice(third + 1),
      ]),
      /duplicate ssm: it already arrived in pieces/,
    ],
  ];
  for (const [what, list, pattern] of cases) {
    const l = ledger("hybrid");
    assert.throws(() => list.forEach((h) => l.accept(h)), (e: unknown) => {
      assert.ok(e instanceof StateValidationError, `${what}: ${e}`);
      assert.match(e.message, pattern, what);
      return true;
    });
    // Poisoned: never ok afterwards.
    assert.equal(l.verifyAgainst(manifestOf(stream.map(componentOf), "hybrid")).ok, false);
  }
});

Deno.test("a manifest is incomplete when a piece is missing, doubled or of another size", () => {
  const stream = completeStream("iswa", N, { pieceBytes: 1500 });
  const swa = stream.flatMap((h, i) => (h.kind === "swa-kv" ? [i] : []));
  assert.equal(swa.length, 3, "4096 bytes in pieces of 1500");
  const components = stream.map(componentOf);
  const check = (list: ManifestComponent[], pattern: RegExp) => {
    const error = findIncompleteness(manifestOf(list, "iswa"), 6);
    assert.ok(error instanceof StateValidationError, String(pattern));
    assert.match(error.message, pattern);
  };
  check(
    components.filter((_, i) => i !== swa[1]),
    /swa-kv layers \[0, 6\) tokens \[0, 2000\) bytes \[1500, 3000\) of 4096 missing/,
  );
  check(
    [...components, components[swa[2]]],
    /swa-kv layers \[0, 6\) tokens \[0, 2000\) bytes \[3000, 4096\) of 4096 duplicated/,
  );
  check(
    components.map((c, i) => i === swa[0] ? { ...c, piece: { range: [0, 1500], of: 5000 } } : c),
    /swa-kv layers \[0, 6\) tokens \[0, 2000\) pieces of 5000 and 4096 bytes/,
  );
  // Staged in full, but the manifest names one piece's checksum differently.
  const l = ledger("iswa");
  for (const h of stream) l.accept(h);
  const forged = components.map((c, i) => i === swa[1] ? { ...c, checksum: "0badc0de" } : c);
  const verdict = l.verifyAgainst(manifestOf(forged, "iswa"));
  assert.equal(verdict.ok, false);
  assert.match(
    verdict.ok ? "" : verdict.error.message,
    /swa-kv layers \[0, 6\) tokens \[0, 2000\) bytes \[1500, 3000\) of 4096 checksum mismatch/,
  );
});
