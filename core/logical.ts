/**
 * Payload codecs of the logical components: `positions` and `sampler` (canonical MessagePack,
 * codec "msgpack") and `history` / `first-token` (little-endian i32 token ids, codec
 * "i32-le"). Decoders validate everything a peer could get wrong and throw
 * StateValidationError; no message ever includes a token value.
 *
 * @module
 */
import { canonicalEncode, decodeMsgpack } from "./bytes.ts";
import { POSITIONS_PER_TOKEN, SEQ_ID_MAX } from "./chunk.ts";
import { StateValidationError } from "./errors.ts";
import type { SamplerState, SamplingParams } from "./sampling.ts";
import { quoteValue, TOKEN_BYTES } from "./schema.ts";

/** Version of the payload layouts below (part of the state schema; bump both together). */
export const LOGICAL_PAYLOAD_VERSION = 1;

/** The `positions` component: where the sequence continues and how positions are laid out. */
export interface PositionsPayload {
  /** n_past: the position of the next token. */
  nPast: number;
  /** Sequence id on the sender (the decoder may import into another). */
  seqId: number;
  nPosPerToken: number;
}

/** The `sampler` component: parameters and, when not greedy, the RNG position. */
export interface SamplerPayload {
  params: SamplingParams;
  state: SamplerState;
}

/**
 * Encodes the `positions` payload.
 *
 * @example
 * ```ts
 * const bytes = encodePositions({ nPast: 4096, seqId: 0, nPosPerToken: 1 });
 * ```
 */
export function encodePositions(p: PositionsPayload): Uint8Array {
  return canonicalEncode({ v: LOGICAL_PAYLOAD_VERSION, ...p });
}

/**
 * Decodes and checks a `positions` payload; throws StateValidationError.
 *
 * @example
 * ```ts
 * const { nPast } = decodePositions(payload);
 * ```
 */
export function decodePositions(bytes: Uint8Array): PositionsPayload {
  const raw = _record(bytes, "positions");
  const ok = _count(raw.nPast) && raw.nPast >= 1 && _count(raw.seqId) &&
    raw.seqId <= SEQ_ID_MAX &&
    (POSITIONS_PER_TOKEN as readonly number[]).includes(raw.nPosPerToken as number);
  if (!ok) throw _invalid("positions", "fields out of range");
  return {
    nPast: raw.nPast as number,
    seqId: raw.seqId as number,
    nPosPerToken: raw.nPosPerToken as number,
  };
}

/**
 * Encodes the `sampler` payload.
 *
 * @example
 * ```ts
 * const bytes = encodeSampler({ params: { temperature: 0.8, topK: 40 }, state: { seed: 7, draws: 1 } });
 * ```
 */
export function encodeSampler(s: SamplerPayload): Uint8Array {
  const params: Record<string, number> = { temperature: s.params.temperature };
  if (s.params.topK !== undefined) params.topK = s.params.topK;
  if (s.params.topP !== undefined) params.topP = s.params.topP;
  return canonicalEncode({ v: LOGICAL_PAYLOAD_VERSION, params, state: { ...s.state } });
}

/**
 * Decodes and checks a `sampler` payload; throws StateValidationError.
 *
 * @example
 * ```ts
 * const { params, state } = decodeSampler(payload);
 * ```
 */
export function decodeSampler(bytes: Uint8Array): SamplerPayload {
  const raw = _record(bytes, "sampler");
  const p = raw.params as Record<string, unknown> | undefined;
  const st = raw.state as Record<string, unknown> | undefined;
  const paramsOk = typeof p === "object" && p !== null && typeof p.temperature === "number" &&
    Number.isFinite(p.temperature) && p.temperature >= 0 &&
    (p.topK === undefined || _count(p.topK)) &&
    (p.topP === undefined || (typeof p.topP === "number" && p.topP > 0 && p.topP <= 1));
  const stateOk = typeof st === "object" && st !== null && _count(st.seed) && _count(st.draws);
  if (!paramsOk || !stateOk) throw _invalid("sampler", "fields out of range");
  const params: SamplingParams = { temperature: p.temperature as number };
  if (p.topK !== undefined) params.topK = p.topK as number;
  if (p.topP !== undefined) params.topP = p.topP as number;
  return { params, state: { seed: st.seed as number, draws: st.draws as number } };
}

/**
 * Little-endian i32 bytes of token ids (`history` and `first-token` payloads).
 *
 * @example
 * ```ts
 * encodeTokens([1, 2, 3]).length; // 12
 * ```
 */
export function encodeTokens(tokens: ArrayLike<number>): Uint8Array {
  const out = new Uint8Array(tokens.length * TOKEN_BYTES);
  const view = new DataView(out.buffer);
  for (let i = 0; i < tokens.length; i++) view.setInt32(i * TOKEN_BYTES, tokens[i], true);
  return out;
}

/**
 * Decodes token ids; refuses a ragged length or a negative id.
 *
 * @example
 * ```ts
 * const history = decodeTokens(payload); // Int32Array
 * ```
 */
export function decodeTokens(
  bytes: Uint8Array,
  kind: "history" | "first-token" = "history",
): Int32Array {
  if (bytes.length % TOKEN_BYTES !== 0) {
    throw _invalid(kind, `${bytes.length} bytes is not a whole number of tokens`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Int32Array(bytes.length / TOKEN_BYTES);
  for (let i = 0; i < out.length; i++) {
    out[i] = view.getInt32(i * TOKEN_BYTES, true);
    if (out[i] < 0) throw _invalid(kind, `token ${i} has a negative id`);
  }
  return out;
}

function _record(bytes: Uint8Array, kind: string): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = decodeMsgpack(bytes);
  } catch (cause) {
    throw _invalid(kind, "not MessagePack", cause);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw _invalid(kind, "not a record");
  }
  const rec = raw as Record<string, unknown>;
  if (rec.v !== LOGICAL_PAYLOAD_VERSION) {
    throw _invalid(kind, `payload version ${quoteValue(rec.v)}`);
  }
  return rec;
}

function _count(x: unknown): x is number {
  return Number.isSafeInteger(x) && (x as number) >= 0;
}

function _invalid(kind: string, detail: string, cause?: unknown): StateValidationError {
  return new StateValidationError(`Invalid ${kind} component: ${detail}`, { cause });
}
