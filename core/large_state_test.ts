/**
 * Schema 2 and 3 at the lab's sizes, with synthetic chunks: no bound a valid request can reach.
 * Nemotron 3 Super: 88 trunk layers, 8,192 B/token of F16 KV, 172,687,360 B of recurrent
 * state (40 Mamba2 layers: conv 122,880 B and SSM 4,194,304 B each), prompts up to 262,144.
 */
import assert from "node:assert/strict";
import { completeStream, DIGEST, fakeChecksum, HANDOFF_ID, header } from "./_test_fixtures.ts";
import { type ChunkHeader, validateChunkHeader } from "./chunk.ts";
import { StateValidationError } from "./errors.ts";
import { StagingLedger } from "./ledger.ts";
import { buildManifest, componentOf, findIncompleteness } from "./manifest.ts";
import { canonicalManifestBytes } from "./manifest_tags.ts";
import { DEFAULT_STATE_BOUNDS, NO_LAYERS, type Range } from "./schema.ts";

const TRUNK = 88;
const KV_BYTES_PER_TOKEN = 8192;
const MTP_KV_BYTES_PER_TOKEN = 1024;
const CONV_LAYER = 122_880;
const SSM_LAYER = 4_194_304;
const MAMBA_LAYERS = 40;
const PROMPT_MAX = 262_144;
const FRAME_PAYLOAD_MAX = 16 * 1024 * 1024;

/** What the exporter sends for a lab-sized prompt: pages of `pageTokens`, split snapshot. */
function labStream(n: number, pageTokens: number): ChunkHeader[] {
  const parts: Partial<ChunkHeader>[] = [];
  for (let p = 0; p < n; p += pageTokens) {
    const end = Math.min(n, p + pageTokens);
    const meta = 64 + 12 * (end - p);
    parts.push({
      kind: "kv-page",
      layerRange: [0, TRUNK],
      tokenRange: [p, end],
      payloadBytes: (end - p) * KV_BYTES_PER_TOKEN + meta,
    });
    parts.push({
      kind: "mtp-kv",
      layerRange: NO_LAYERS,
      tokenRange: [p, end],
      payloadBytes: (end - p) * MTP_KV_BYTES_PER_TOKEN + meta,
    });
  }
  // Mamba layer i sits at trunk layer 2i + 1 in this synthetic pattern; 3 SSM layers a chunk.
  const convRule = { codec: "llama-recurrent-rows", dtype: "f32", tokenRange: [0, n] as const };
  parts.push({ kind: "conv", layerRange: [0, TRUNK], ...convRule, payloadBytes: 40 * CONV_LAYER });
  for (let m = 0; m < MAMBA_LAYERS; m += 3) {
    const a = m === 0 ? 0 : 2 * m + 1;
    const last = Math.min(MAMBA_LAYERS, m + 3);
    const b = last === MAMBA_LAYERS ? TRUNK : 2 * last + 1;
    parts.push({
      kind: "ssm",
      layerRange: [a, b],
      ...convRule,
      payloadBytes: (last - m) * (12 + SSM_LAYER),
    });
  }
  const tail = completeStream("hybrid-moe-mtp", n, { layers: TRUNK })
    .filter((h) => !["kv-page", "mtp-kv", "conv", "ssm"].includes(h.kind));
  for (const h of tail) parts.push(h);
  return parts.map((p, seq) =>
    header({ ...p, seq, checksum: fakeChecksum(seq + 1), final: seq === parts.length - 1 })
  );
}

Deno.test("a 262,144-token lab-state handoff fits every bound: chunks, credit, manifest", () => {
  const stream = labStream(PROMPT_MAX, 512);
  const bounds = DEFAULT_STATE_BOUNDS;
  assert.ok(bounds.chunkPayloadBytesMax <= FRAME_PAYLOAD_MAX, "a chunk fits one frame");
  const ledger = new StagingLedger({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family: "hybrid-moe-mtp",
    trunkLayers: TRUNK,
    creditBytes: 1024 * 1024 * 1024,
  });
  let total = 0;
  for (const h of stream) {
    validateChunkHeader(h, bounds); // every chunk within chunkPayloadBytesMax
    ledger.accept(h);
    total += h.payloadBytes;
    // The decoder gives credit back for every page it imports.
    if (h.kind === "kv-page" || h.kind === "mtp-kv") ledger.grantCredit(h.payloadBytes);
  }
  assert.ok(total > 2 * 1024 ** 3 + 172_687_360, `state of ${total} bytes`);
  assert.ok(stream.length < bounds.chunksMax);
  const manifest = buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family: "hybrid-moe-mtp",
    components: stream.map(componentOf),
    logical: { position: PROMPT_MAX, tokenCount: PROMPT_MAX },
  });
  assert.equal(findIncompleteness(manifest, TRUNK), null);
  const verdict = ledger.verifyAgainst({ ...manifest, tag: "ee".repeat(32) });
  assert.deepEqual(verdict, { ok: true });
  // The manifest is a frame payload: it must fit one, with room to spare.
  assert.ok(canonicalManifestBytes(manifest).byteLength < FRAME_PAYLOAD_MAX / 8);
});

Deno.test("a snapshot split by layer ranges is incomplete when one range is missing", () => {
  const stream = labStream(1024, 512);
  const at = stream.findIndex((h) => h.kind === "ssm" && h.layerRange[0] > 0);
  const holed = stream.filter((_, i) => i !== at);
  const error = findIncompleteness(
    {
      family: "hybrid-moe-mtp",
      components: holed.map(componentOf),
      logical: { position: 1024, tokenCount: 1024 },
    },
    TRUNK,
  );
  assert.ok(error instanceof StateValidationError);
  const [a, b] = stream[at].layerRange;
  assert.match(error.message, new RegExp(`ssm layers \\[${a}, ${b}\\) missing`));
});

Deno.test("MTP KV pages stream in their own lane: a hole or a short lane is refused", () => {
  const stream = labStream(1536, 512);
  const ledger = () =>
    new StagingLedger({
      handoffId: HANDOFF_ID,
      identityDigest: DIGEST,
      family: "hybrid-moe-mtp",
      trunkLayers: TRUNK,
      creditBytes: 1 << 30,
    });
  // A hole: the second MTP page never arrives (seq numbers stay contiguous).
  const mtpPages = stream.filter((h) => h.kind === "mtp-kv");
  const holed = stream.filter((h) => h !== mtpPages[1]).map((h, seq) => ({ ...h, seq }));
  const l1 = ledger();
  assert.throws(
    () => holed.forEach((h) => l1.accept(h)),
    /mtp-kv tokens \[512, 1024\) missing/,
  );
  // A short lane: the last MTP page never comes; the snapshot fixed n, so verify refuses.
  const short = stream.filter((h) => h !== mtpPages[2]).map((h, seq) => ({ ...h, seq }));
  const l2 = ledger();
  for (const h of short) l2.accept(h);
  const manifest = buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family: "hybrid-moe-mtp",
    components: short.map(componentOf),
    logical: { position: 1536, tokenCount: 1536 },
  });
  const verdict = l2.verifyAgainst({ ...manifest, tag: "ee".repeat(32) });
  assert.equal(verdict.ok, false);
  assert.match(verdict.ok ? "" : verdict.error.message, /mtp-kv tokens \[1024, 1536\) missing/);
});

/** `bytes` of `kind` over `layerRange` as chunks within the frame bound: pieces when larger. */
function cut(kind: "conv" | "ssm" | "swa-kv", layerRange: Range, n: number, bytes: number) {
  const base = kind === "swa-kv"
    ? { kind, layerRange, tokenRange: [0, n] as Range, codec: "llama-kv-cells", dtype: "f16/f16" }
    : {
      kind,
      layerRange,
      tokenRange: [0, n] as Range,
      codec: "llama-recurrent-rows",
      dtype: "f32",
    };
  const out: Partial<ChunkHeader>[] = [];
  for (let a = 0; a < bytes; a += FRAME_PAYLOAD_MAX) {
    const b = Math.min(bytes, a + FRAME_PAYLOAD_MAX);
    out.push({
      ...base,
      payloadBytes: b - a,
      ...(bytes > FRAME_PAYLOAD_MAX ? { piece: { range: [a, b], of: bytes } } : {}),
    });
  }
  return out;
}

Deno.test("schema 3: a recurrent layer and a SWA cache larger than a chunk fit every bound in pieces", () => {
  // A model whose one Mamba layer holds 40 MiB of SSM state (10x Super's), and an ISWA model
  // whose sliding-window cache is 300 MiB, at the lab's 262,144-token prompt.
  const SSM_BIG = 40 * 1024 * 1024 + 12;
  for (const family of ["recurrent", "iswa"] as const) {
    const parts: Partial<ChunkHeader>[] = [];
    const layers = family === "recurrent" ? 4 : TRUNK;
    if (family === "recurrent") {
      for (let l = 0; l < layers; l++) {
        parts.push(...cut("conv", [l, l + 1], PROMPT_MAX, CONV_LAYER));
      }
      for (let l = 0; l < layers; l++) parts.push(...cut("ssm", [l, l + 1], PROMPT_MAX, SSM_BIG));
    } else {
      for (let p = 0; p < PROMPT_MAX; p += 1024) {
        parts.push({
          kind: "kv-page",
          layerRange: [0, layers],
          tokenRange: [p, p + 1024],
          payloadBytes: 1024 * KV_BYTES_PER_TOKEN,
        });
      }
      parts.push(...cut("swa-kv", [0, layers], PROMPT_MAX, 300 * 1024 * 1024));
    }
    const tail = completeStream(family, PROMPT_MAX, { layers })
      .filter((h) => !["kv-page", "swa-kv", "conv", "ssm"].includes(h.kind));
    const stream = [...parts, ...tail].map((p, seq, all) =>
      header({ ...p, seq, checksum: fakeChecksum(seq + 1), final: seq === all.length - 1 })
    );
    assert.ok(stream.some((h) => h.piece), family);
    const ledger = new StagingLedger({
      handoffId: HANDOFF_ID,
      identityDigest: DIGEST,
      family,
      trunkLayers: layers,
      creditBytes: 1024 * 1024 * 1024,
    });
    for (const h of stream) {
      validateChunkHeader(h, DEFAULT_STATE_BOUNDS);
      assert.ok(h.payloadBytes <= FRAME_PAYLOAD_MAX);
      ledger.accept(h);
      if (h.kind === "kv-page") ledger.grantCredit(h.payloadBytes);
    }
    const manifest = buildManifest({
      handoffId: HANDOFF_ID,
      identityDigest: DIGEST,
      family,
      components: stream.map(componentOf),
      logical: { position: PROMPT_MAX, tokenCount: PROMPT_MAX },
    });
    assert.equal(findIncompleteness(manifest, layers), null, family);
    assert.deepEqual(ledger.verifyAgainst({ ...manifest, tag: "ee".repeat(32) }), { ok: true });
    assert.ok(canonicalManifestBytes(manifest).byteLength < FRAME_PAYLOAD_MAX / 8);
  }
});
