/**
 * State chunk headers: what each streamed piece of continuation state says about itself, a
 * validator for headers received from a peer, payload checks, and the chunk binding tag.
 *
 * A receiver runs, in order: `verifyChunkTag` (is this for me, this handoff, this tenant?),
 * `validateChunkHeader` (is it well formed?), `verifyChunkPayload` (size and checksum),
 * then `StagingLedger.accept` (does it fit what already arrived?).
 *
 * @module
 */
import { type BindingContext, computeBindingTag, verifyBindingTag } from "./binding.ts";
import { canonicalEncode, isHex, SHA256_BYTES } from "./bytes.ts";
import { crc32c } from "./crc32c.ts";
import { StateValidationError } from "./errors.ts";
import {
  type ComponentKind,
  componentRule,
  DEFAULT_STATE_BOUNDS,
  describeComponent,
  dtypeAllowed,
  isComponentKind,
  quoteValue,
  type Range,
  rangeWithin,
  type StateBounds,
  SUPPORTED_STATE_SCHEMA_VERSIONS,
} from "./schema.ts";

/** Highest sequence id a chunk may name (llama.cpp `n_seq_max` stays far below). */
export const SEQ_ID_MAX = 255;
/** Positions per token: 1, or 4 for M-RoPE models. */
export const POSITIONS_PER_TOKEN = [1, 4] as const;

// Element sizes of the plain (unquantized) dtypes, for whole-element payload checks.
const ELEMENT_BYTES: Record<string, number> = { f32: 4, f16: 2, bf16: 2, i32: 4 };

/** How token positions of the payload are laid out on the sending side. */
export interface PositionConfig {
  /** Sequence id the state was exported from (the importer may place it elsewhere). */
  seqId: number;
  /** Position values per token (1, or 4 for M-RoPE). */
  nPosPerToken: number;
}

/** The self-description of one streamed piece of state. Payload bytes travel beside it. */
export interface ChunkHeader {
  handoffId: string;
  /** `identityDigest()` of the sender's numerical identity. */
  identityDigest: string;
  schemaVersion: number;
  kind: ComponentKind;
  /** Trunk layers covered, `[a, b)`; `NO_LAYERS` for kinds not scoped to layers. */
  layerRange: Range;
  /** Token positions covered, `[p0, p1)`; see `TokenRule` per kind. */
  tokenRange: Range;
  codec: string;
  dtype: string;
  positionConfig: PositionConfig;
  payloadBytes: number;
  /** CRC-32C of the payload, 8 hex digits (see `payloadChecksum`). Never printed. */
  checksum: string;
  /** Position of this chunk in the handoff's stream, from 0 without gaps. */
  seq: number;
  /** True on the last chunk of the stream; the manifest follows. */
  final: boolean;
}

/**
 * Names a chunk for messages: `chunk 12 (kv-page layers [0, 8) tokens [0, 512))`.
 */
export function describeChunk(
  h: Pick<ChunkHeader, "seq" | "kind" | "layerRange" | "tokenRange">,
): string {
  return `chunk ${h.seq} (${describeComponent(h.kind, h.layerRange, h.tokenRange)})`;
}

/**
 * Checks a header received from a peer and returns it typed; throws StateValidationError
 * naming the chunk, component and range on the first problem.
 *
 * @example
 * ```ts
 * const header = validateChunkHeader(decodeMsgpack(frame.header), bounds);
 * ```
 */
export function validateChunkHeader(
  raw: unknown,
  bounds: StateBounds = DEFAULT_STATE_BOUNDS,
): ChunkHeader {
  const h = raw as Partial<ChunkHeader> | null;
  const fail = (name: string, detail: string): never => {
    throw new StateValidationError(`Invalid state ${name}: ${detail}`, {
      hint: "the peer sent a malformed chunk; check both run the same skippy-disagg version",
    });
  };
  if (typeof h !== "object" || h === null) return fail("chunk", "header is not a record");
  const seqOk = Number.isSafeInteger(h.seq) && h.seq! >= 0 && h.seq! < bounds.chunksMax;
  if (!seqOk) return fail("chunk", `sequence number ${quoteValue(h.seq)} out of range`);
  if (!isComponentKind(h.kind)) {
    return fail(`chunk ${h.seq}`, `unknown kind ${quoteValue(h.kind)}`);
  }
  const rule = componentRule(h.kind);
  const layersOk = rule.layered
    ? rangeWithin(h.layerRange, bounds.layersMax) && h.layerRange[0] < h.layerRange[1]
    : rangeWithin(h.layerRange, 0);
  if (!layersOk) {
    const want = rule.layered ? `a non-empty range within [0, ${bounds.layersMax})` : "[0, 0)";
    return fail(`chunk ${h.seq} (${h.kind})`, `layer range must be ${want}`);
  }
  if (!rangeWithin(h.tokenRange, bounds.tokenPositionMax) || !_tokenShapeOk(h.kind, h.tokenRange)) {
    return fail(`chunk ${h.seq} (${h.kind})`, `token range does not fit rule "${rule.tokens}"`);
  }
  const name = describeChunk(h as ChunkHeader);
  _checkFields(h, bounds, (detail) => fail(name, detail));
  return h as ChunkHeader;
}

function _tokenShapeOk(kind: ComponentKind, [p0, p1]: Range): boolean {
  switch (componentRule(kind).tokens) {
    case "page":
      return p1 > p0;
    case "prefix":
      return p0 === 0 && p1 >= 1;
    case "last":
    case "next":
      return p1 === p0 + 1;
  }
}

function _checkFields(
  h: Partial<ChunkHeader>,
  bounds: StateBounds,
  fail: (detail: string) => never,
): void {
  const kind = h.kind as ComponentKind;
  const rule = componentRule(kind);
  if (!_idOk(h.handoffId, bounds)) fail("handoff id missing or too long");
  if (!isHex(h.identityDigest, SHA256_BYTES)) fail("identity digest is not a SHA-256 hex string");
  if (!SUPPORTED_STATE_SCHEMA_VERSIONS.includes(h.schemaVersion as number)) {
    fail(`unsupported state schema version ${quoteValue(h.schemaVersion)}`);
  }
  if (typeof h.codec !== "string" || !rule.codecs.includes(h.codec)) {
    fail(`codec ${quoteValue(h.codec)} is not one of ${rule.codecs.join(", ")}`);
  }
  if (typeof h.dtype !== "string" || !dtypeAllowed(kind, h.dtype)) {
    fail(`dtype ${quoteValue(h.dtype)} not allowed for ${kind}`);
  }
  const pc = h.positionConfig;
  const pcOk = typeof pc === "object" && pc !== null && Number.isSafeInteger(pc.seqId) &&
    pc.seqId >= 0 && pc.seqId <= SEQ_ID_MAX &&
    (POSITIONS_PER_TOKEN as readonly number[]).includes(pc.nPosPerToken);
  if (!pcOk) fail("position configuration invalid");
  if (typeof h.final !== "boolean") fail("final marker is not a boolean");
  if (!isHex(h.checksum, CHECKSUM_BYTES)) fail("checksum is not a CRC-32C hex string");
  _checkPayloadBytes(h, bounds, fail);
}

function _idOk(id: unknown, bounds: StateBounds): boolean {
  return typeof id === "string" && id.length > 0 && id.length <= bounds.idLengthMax;
}

function _checkPayloadBytes(
  h: Partial<ChunkHeader>,
  bounds: StateBounds,
  fail: (detail: string) => never,
): void {
  const bytes = h.payloadBytes as number;
  if (!Number.isSafeInteger(bytes) || bytes < 1) fail("payload size is not a positive integer");
  if (bytes > bounds.chunkPayloadBytesMax) {
    fail(`payload of ${bytes} bytes exceeds chunkPayloadBytesMax ${bounds.chunkPayloadBytesMax}`);
  }
  const rule = componentRule(h.kind as ComponentKind);
  const [p0, p1] = h.tokenRange as Range;
  if (rule.bytesPerToken > 0 && bytes !== rule.bytesPerToken * (p1 - p0)) {
    fail(`payload of ${bytes} bytes, expected ${rule.bytesPerToken} per token`);
  }
  // Token-sized components (history) are bounded by their token range above.
  if (rule.order === "any" && rule.bytesPerToken === 0 && bytes > bounds.metaBytesMax) {
    fail(`payload of ${bytes} bytes exceeds metaBytesMax ${bounds.metaBytesMax}`);
  }
  const elementBytes = ELEMENT_BYTES[h.dtype as string];
  if (rule.dtypes !== "kv" && elementBytes && bytes % elementBytes !== 0) {
    fail(`payload of ${bytes} bytes is not a whole number of ${h.dtype} values`);
  }
}

/**
 * Canonical bytes of a header: what the binding tag covers.
 *
 * @example
 * ```ts
 * const bytes = canonicalHeaderBytes(header);
 * ```
 */
export function canonicalHeaderBytes(h: ChunkHeader): Uint8Array {
  return canonicalEncode({
    handoffId: h.handoffId,
    identityDigest: h.identityDigest,
    schemaVersion: h.schemaVersion,
    kind: h.kind,
    layerRange: [h.layerRange[0], h.layerRange[1]],
    tokenRange: [h.tokenRange[0], h.tokenRange[1]],
    codec: h.codec,
    dtype: h.dtype,
    positionConfig: { seqId: h.positionConfig.seqId, nPosPerToken: h.positionConfig.nPosPerToken },
    payloadBytes: h.payloadBytes,
    checksum: h.checksum,
    seq: h.seq,
    final: h.final,
  });
}

/** Bytes of a payload checksum (CRC-32C). */
export const CHECKSUM_BYTES = 4;

/**
 * CRC-32C of a payload as 8 hex digits, for `ChunkHeader.checksum` (schema 2; schema 1 used
 * SHA-256). Why not a cryptographic hash: integrity against anyone on the path is QUIC's
 * AEAD, and the binding tag (an HMAC under the reservation's key) binds the header, checksum
 * included, to the handoff, destination and tenant. The checksum's job is to tie a payload to
 * its tagged header and catch corruption between export and import; SHA-256 in JavaScript ran
 * at ~0.55 GB/s here (about the QUIC stack's own rate, once per side), CRC-32C in the shim's
 * hardware path at ~8 GB/s.
 *
 * @example
 * ```ts
 * const checksum = payloadChecksum(pageBytes);
 * ```
 */
export function payloadChecksum(payload: Uint8Array): string {
  return crc32c(payload).toString(16).padStart(2 * CHECKSUM_BYTES, "0");
}

/**
 * Throws StateValidationError when `payload` does not have the header's size or checksum.
 * The message names the chunk and never shows a checksum (it is derived from content).
 *
 * @example
 * ```ts
 * verifyChunkPayload(header, payload);
 * ```
 */
export function verifyChunkPayload(h: ChunkHeader, payload: Uint8Array): void {
  if (payload.length !== h.payloadBytes) {
    throw new StateValidationError(
      `Cannot stage state ${
        describeChunk(h)
      }: size mismatch (header ${h.payloadBytes} bytes, received ${payload.length})`,
    );
  }
  if (payloadChecksum(payload) !== h.checksum) {
    throw new StateValidationError(`Cannot stage state ${describeChunk(h)}: checksum mismatch`, {
      hint: "the payload was corrupted in transit; the handoff will be retried or recomputed",
    });
  }
}

/**
 * The binding tag of a chunk header (the payload is bound through its checksum).
 *
 * @example
 * ```ts
 * const tag = await computeChunkTag(binding, header);
 * ```
 */
export function computeChunkTag(ctx: BindingContext, h: ChunkHeader): Promise<string> {
  return computeBindingTag(ctx, "state-chunk", canonicalHeaderBytes(h));
}

/**
 * True when `tag` binds `h` to the handoff, destination and tenant of `ctx`.
 *
 * @example
 * ```ts
 * if (!await verifyChunkTag(binding, header, tag)) reject("binding-tag");
 * ```
 */
export async function verifyChunkTag(
  ctx: BindingContext,
  h: ChunkHeader,
  tag: string,
): Promise<boolean> {
  if (h.handoffId !== ctx.handoffId) return false;
  return await verifyBindingTag(ctx, "state-chunk", canonicalHeaderBytes(h), tag);
}
