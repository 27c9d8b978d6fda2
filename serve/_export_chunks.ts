/**
 * How the exporter cuts state into chunks: one chunk per component, or byte pieces of
 * `chunkBytesMax` when larger, each with its typed header (kind, layer and token ranges, codec,
 * dtype, checksum) and the handoff's running sequence number.
 */
import {
  type BytePiece,
  type ChunkHeader,
  type ComponentKind,
  kvDtype,
  NO_LAYERS,
  payloadChecksum,
  type Range,
  STATE_SCHEMA_VERSION,
} from "../core/mod.ts";
import type { ResolvedIdentity } from "./identity.ts";

/** A chunk ready to send: its header and payload. */
export interface ExportedChunk {
  header: ChunkHeader;
  payload: Uint8Array;
  /** A page of tokens restored from the prefix cache, not computed by this request. */
  cached?: boolean;
}

/** Makes one handoff's chunks, numbering them in the order they are made. */
export class ChunkMaker {
  #seq = 0;

  constructor(
    readonly identity: ResolvedIdentity,
    readonly handoffId: string,
    readonly chunkBytesMax: number,
  ) {}

  /**
   * `payload` as one chunk, or as byte pieces of `chunkBytesMax` (views of it) when larger;
   * `final` marks the last.
   */
  cut(
    kind: ComponentKind,
    layersOrTokens: Range,
    payload: Uint8Array,
    final: boolean,
    snapshotTokens?: Range,
  ): ExportedChunk[] {
    const of = payload.byteLength;
    const step = this.chunkBytesMax;
    if (of <= step) return [this.chunk(kind, layersOrTokens, payload, final, snapshotTokens)];
    const out: ExportedChunk[] = [];
    for (let at = 0; at < of; at += step) {
      const end = Math.min(of, at + step);
      const piece = { range: [at, end] as Range, of };
      const last = end === of;
      const view = payload.subarray(at, end);
      out.push(this.chunk(kind, layersOrTokens, view, final && last, snapshotTokens, piece));
    }
    return out;
  }

  chunk(
    kind: ComponentKind,
    layersOrTokens: Range,
    payload: Uint8Array,
    final: boolean,
    snapshotTokens?: Range,
    piece?: BytePiece,
  ): ExportedChunk {
    const layered = kind === "kv-page" || kind === "swa-kv" || kind === "conv" || kind === "ssm";
    const id = this.identity.numerical;
    const trunk = id.layerKinds.filter((k) => k !== "mtp").length;
    // Snapshot chunks name their layer run and the tokens they are the state of.
    const tokenRange = snapshotTokens ?? layersOrTokens;
    const layerRange: Range = snapshotTokens ? layersOrTokens : layered ? [0, trunk] : NO_LAYERS;
    const header: ChunkHeader = {
      handoffId: this.handoffId,
      identityDigest: this.identity.digest,
      schemaVersion: STATE_SCHEMA_VERSION,
      kind,
      layerRange,
      tokenRange,
      codec: CODEC[kind],
      dtype: DTYPE[kind] ?? kvDtype(id.kType, id.vType),
      positionConfig: { seqId: 0, nPosPerToken: 1 },
      payloadBytes: payload.byteLength,
      checksum: payloadChecksum(payload),
      seq: this.#seq++,
      final,
      ...(piece ? { piece } : {}),
    };
    return { header, payload };
  }
}

const CODEC: Record<ComponentKind, string> = {
  "kv-page": "llama-kv-cells",
  "swa-kv": "llama-kv-cells",
  "conv": "llama-recurrent-rows",
  "ssm": "llama-recurrent-rows",
  "mtp-kv": "llama-kv-cells",
  "mtp-hidden": "f32-rows",
  "positions": "msgpack",
  "sampler": "msgpack",
  "history": "i32-le",
  "first-token": "i32-le",
};

const DTYPE: Partial<Record<ComponentKind, string>> = {
  "conv": "f32",
  "ssm": "f32",
  "mtp-hidden": "f32",
  "positions": "none",
  "sampler": "none",
  "history": "i32",
  "first-token": "i32",
};
