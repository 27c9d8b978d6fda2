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
  type BytePiece,
  type ComponentKind,
  componentRule,
  DEFAULT_STATE_BOUNDS,
  describeComponent,
  dtypeAllowed,
  formatPiece,
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
  /**
   * Set when the component travels as byte pieces (schema 3): this payload is bytes
   * `piece.range` of the component's `piece.of` bytes. Absent on a whole component.
   */
  piece?: BytePiece;
}

/**
 * Names a chunk for messages: `chunk 12 (kv-page layers [0, 8) tokens [0, 512))`, and for a
 * piece `chunk 40 (ssm layers [3, 5) tokens [0, 512) bytes [0, 16777216) of 41943052)`.
 */
export function describeChunk(
  h: Pick<ChunkHeader, "seq" | "kind" | "layerRange" | "tokenRange" | "piece">,
): string {
  const piece = formatPiece(h.piece);
  return `chunk ${h.seq} (${describeComponent(h.kind, h.layerRange, h.tokenRange)}${piece})`;
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
  if (h.piece !== undefined) _checkPiece(h, bounds, fail);
  _checkPayloadBytes(h, bounds, fail);
}

/** A piece names a non-empty byte range of a component that may be cut, its payload's size. */
function _checkPiece(
  h: Partial<ChunkHeader>,
  bounds: StateBounds,
  fail: (detail: string) => never,
): void {
  const piece = h.piece as Partial<BytePiece> | null;
  if (!componentRule(h.kind as ComponentKind).pieces) fail(`${h.kind} does not travel in pieces`);
  const of = piece?.of;
  const ofOk = typeof piece === "object" && piece !== null && Number.isSafeInteger(of) &&
    of! >= 1 && of! <= bounds.stateBytesMax;
  if (!ofOk) fail(`piece size ${quoteValue(of)} is not within [1, ${bounds.stateBytesMax}]`);
  if (!rangeWithin(piece!.range, of!) || piece!.range![0] >= piece!.range![1]) {
    fail(`piece range ${quoteValue(piece!.range)} is not a non-empty range within [0, ${of})`);
  }
  const [a, b] = piece!.range!;
  if (h.payloadBytes !== b - a) {
    fail(`payload of ${quoteValue(h.payloadBytes)} bytes for a piece of ${b - a}`);
  }
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
  // The component's bytes: the payload's, or for a piece the whole it is cut from.
  const whole = h.piece?.of ?? bytes;
  const what = h.piece ? "component" : "payload";
  if (rule.bytesPerToken > 0 && whole !== rule.bytesPerToken * (p1 - p0)) {
    fail(`${what} of ${whole} bytes, expected ${rule.bytesPerToken} per token`);
  }
  // Token-sized components (history) are bounded by their token range above.
  if (rule.order === "any" && rule.bytesPerToken === 0 && whole > bounds.metaBytesMax) {
    fail(`${what} of ${whole} bytes exceeds metaBytesMax ${bounds.metaBytesMax}`);
  }
  const elementBytes = ELEMENT_BYTES[h.dtype as string];
  if (rule.dtypes !== "kv" && elementBytes && whole % elementBytes !== 0) {
    fail(`${what} of ${whole} bytes is not a whole number of ${h.dtype} values`);
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
    ...(h.piece ? { piece: { range: [h.piece.range[0], h.piece.range[1]], of: h.piece.of } } : {}),
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
