/**
 * Shared fixtures for `core/` tests: a small hybrid identity and complete chunk streams.
 * Private (underscore): never re-exported from `mod.ts`.
 */
import type { ChunkHeader } from "./chunk.ts";
import type { NumericalIdentity } from "./identity.ts";
import type { PlanInput } from "./planner.ts";
import {
  type ComponentKind,
  componentRule,
  kvDtype,
  type ModelFamily,
  NO_LAYERS,
  type Range,
  requiredComponents,
  STATE_SCHEMA_VERSION,
} from "./schema.ts";

export const DIGEST = "ab".repeat(32);
export const OTHER_DIGEST = "cd".repeat(32);
export const HANDOFF_ID = "h-0001";

/** 4 Mamba layers and 2 attention layers, like the tiny model in the runtime notes. */
export function hybridIdentity(overrides: Partial<NumericalIdentity> = {}): NumericalIdentity {
  return {
    modelDigest: "3f2a9c1b".repeat(8),
    tokenizerDigest: "77b1e0d2".repeat(8),
    architecture: "nemotron_h",
    family: "hybrid",
    layerCount: 6,
    layerKinds: ["recurrent", "recurrent", "attention", "recurrent", "recurrent", "attention"],
    nCtx: 8192,
    kType: "f16",
    vType: "f16",
    flashAttention: true,
    kvUnified: true,
    swaFull: false,
    nUbatch: 512,
    threadCount: 2,
    cpuBackendVariant: "haswell",
    gpuLayers: 0,
    computeBackend: "CPU",
    computeDevice: "CPU",
    stateSchemaVersion: STATE_SCHEMA_VERSION,
    llamaBuild: "v0.5.0+0123abcd",
    shimAbiVersion: 1,
    ...overrides,
  };
}

/** A fake but well-formed checksum that differs per component. */
export function fakeChecksum(i: number): string {
  return i.toString(16).padStart(8, "0");
}

/** A valid header; override any field. */
export function header(overrides: Partial<ChunkHeader> = {}): ChunkHeader {
  return {
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    schemaVersion: STATE_SCHEMA_VERSION,
    kind: "kv-page",
    layerRange: [0, 6],
    tokenRange: [0, 512],
    codec: "llama-kv-cells",
    dtype: kvDtype("f16", "f16"),
    positionConfig: { seqId: 0, nPosPerToken: 1 },
    payloadBytes: 512 * 64,
    checksum: fakeChecksum(1),
    seq: 0,
    final: false,
    ...overrides,
  };
}

function _component(kind: ComponentKind, n: number, layers: number): Partial<ChunkHeader> {
  const rule = componentRule(kind);
  const tokenRange: Range = rule.tokens === "next"
    ? [n, n + 1]
    : rule.tokens === "last"
    ? [n - 1, n]
    : [0, n];
  const dtype = rule.dtypes === "kv" ? kvDtype("f16", "f16") : rule.dtypes[0];
  const payloadBytes = rule.bytesPerToken > 0
    ? rule.bytesPerToken * (tokenRange[1] - tokenRange[0])
    : 4096;
  return {
    kind,
    layerRange: rule.layered ? [0, layers] : NO_LAYERS,
    tokenRange,
    codec: rule.codecs[0],
    dtype,
    payloadBytes,
  };
}

/**
 * A complete, correctly ordered stream for `family` at position `n`: KV pages of
 * `pageTokens`, then the snapshot kinds, then the logical kinds; the last chunk is final.
 */
export function completeStream(
  family: ModelFamily,
  n: number,
  options: {
    pageTokens?: number;
    layers?: number;
    snapshotParts?: number;
    /** Cut every component that may travel in pieces into byte pieces of at most this. */
    pieceBytes?: number;
  } = {},
): ChunkHeader[] {
  const pageTokens = options.pageTokens ?? 512;
  const layers = options.layers ?? 6;
  const parts: Partial<ChunkHeader>[] = [];
  const kinds = requiredComponents(family);
  const paged = (["kv-page", "mtp-kv"] as const).filter((k) => kinds.includes(k));
  for (let p = 0; paged.length > 0 && p < n; p += pageTokens) {
    const end = Math.min(n, p + pageTokens);
    for (const kind of paged) {
      parts.push({
        kind,
        layerRange: kind === "kv-page" ? [0, layers] : NO_LAYERS,
        tokenRange: [p, end],
        payloadBytes: (end - p) * 64,
      });
    }
  }
  const split = options.snapshotParts ?? 1;
  for (const kind of kinds) {
    if (paged.includes(kind as typeof paged[number])) continue;
    const c = _component(kind, n, layers);
    const cut = (whole: Partial<ChunkHeader>) =>
      parts.push(..._pieces(whole, componentRule(kind).pieces ? options.pieceBytes : undefined));
    if (split === 1 || !componentRule(kind).layered) {
      cut(c);
      continue;
    }
    // The snapshot cut into layer ranges that tile [0, layers), as schema 2 sends it.
    for (let i = 0; i < split; i++) {
      const a = Math.floor((i * layers) / split);
      const b = Math.floor(((i + 1) * layers) / split);
      if (b > a) cut({ ...c, layerRange: [a, b] });
    }
  }
  return parts.map((p, seq) =>
    header({ ...p, seq, checksum: fakeChecksum(seq + 1), final: seq === parts.length - 1 })
  );
}

/** `c` as byte pieces of at most `pieceBytes` (schema 3), or whole when it fits or is unset. */
function _pieces(c: Partial<ChunkHeader>, pieceBytes?: number): Partial<ChunkHeader>[] {
  const of = c.payloadBytes!;
  if (pieceBytes === undefined || of <= pieceBytes) return [c];
  const out: Partial<ChunkHeader>[] = [];
  for (let a = 0; a < of; a += pieceBytes) {
    const b = Math.min(of, a + pieceBytes);
    out.push({ ...c, payloadBytes: b - a, piece: { range: [a, b], of } });
  }
  return out;
}

/** Total payload bytes of a stream. */
export function streamBytes(stream: readonly ChunkHeader[]): number {
  return stream.reduce((s, h) => s + h.payloadBytes, 0);
}

/**
 * A planner input with Nemotron-Super-like sizes from the design note (8 KiB/token of KV, ~160
 * MiB recurrent), a fresh 40 Gb/s link and every eligibility flag set; `overrides` replace fields.
 */
export function planInput(overrides: Partial<PlanInput> = {}): PlanInput {
  const MIB = 1024 * 1024;
  return {
    promptTokens: 32_768,
    state: { kvBytesPerToken: 8192, recurrentBytes: 160 * MIB },
    link: { bandwidthBytesPerS: 5e9, rttMs: 0.3, ageMs: 1000 }, // 40 Gb/s
    prefillerPrefillTokensPerS: 4000,
    decoderPrefillTokensPerS: 1500,
    decoderFreeBytes: 64 * 1024 * MIB,
    chunkTokens: 2048,
    flags: {
      prefillerHasPrefillRole: true,
      decoderHasDecodeRole: true,
      schemaShared: true,
      identityMatch: true,
      familyCertified: true,
    },
    ...overrides,
  };
}
