/**
 * How a PrefillRequest or GenerateRequest travels: its small header, and its prompt, the
 * prompt's special-token spans and a resume's sent tokens in the frame's payload.
 */
import { ProtocolError } from "../core/mod.ts";
import type { GenerateRequest, PrefillRequest } from "./messages.ts";
import {
  PROMPT_BYTES_MAX,
  PROMPT_SPECIAL_SPANS_MAX,
  SENT_TOKENS_HEADER_MAX,
  SENT_TOKENS_MAX,
} from "./message_bounds.ts";

const count = (v: unknown, max = Number.MAX_SAFE_INTEGER) =>
  Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= max;

/**
 * The payload of a PrefillRequest or GenerateRequest: the prompt (UTF-8); then, when the
 * prompt has special-token spans, those as uint32 little-endian byte offsets (the header says
 * how many numbers in `promptSpecialSpansInPayload`); then, for a GenerateRequest with more
 * than SENT_TOKENS_HEADER_MAX sent tokens, those tokens as int32 little-endian (the header
 * says how many in `sentTokensInPayload`). With either, `promptBytesInPayload` says where the
 * prompt ends. Returns the header to send (without prompt, spans and sent tokens) and the
 * payload.
 */
export function encodeRequestPayload(
  request: PrefillRequest | GenerateRequest,
): { header: Record<string, unknown>; payload: Uint8Array | undefined } {
  const prompt = request.prompt;
  const header: Record<string, unknown> = { ...request, prompt: null };
  delete header.promptSpecialSpans;
  const text = prompt === null ? new Uint8Array(0) : new TextEncoder().encode(prompt);
  const spans = request.promptSpecialSpans ?? [];
  const sent = request.type === "GenerateRequest" ? request.sentTokens ?? [] : [];
  const sentInPayload = sent.length > SENT_TOKENS_HEADER_MAX;
  if (!sentInPayload && spans.length === 0) {
    return { header, payload: prompt === null ? undefined : text };
  }
  if (spans.length > 0) header.promptSpecialSpansInPayload = spans.length;
  if (sentInPayload) {
    delete header.sentTokens;
    header.sentTokensInPayload = sent.length;
  }
  header.promptBytesInPayload = prompt === null ? null : text.length;
  const tail = sentInPayload ? sent : [];
  const payload = new Uint8Array(text.length + 4 * spans.length + 4 * tail.length);
  payload.set(text);
  const view = new DataView(payload.buffer, text.length);
  spans.forEach((x, i) => view.setUint32(4 * i, x, true));
  tail.forEach((t, i) => view.setInt32(4 * (spans.length + i), t, true));
  return { header, payload };
}

/**
 * The receiving side of `encodeRequestPayload`: sets `prompt` (and `promptSpecialSpans` and
 * `sentTokens` when they travelled in the payload) on a received request header, in place.
 * Throws ProtocolError when the payload does not match what the header says.
 */
export function decodeRequestPayload(header: Record<string, unknown>, payload: Uint8Array): void {
  const n = header.sentTokensInPayload;
  const k = header.promptSpecialSpansInPayload;
  if (n === undefined && k === undefined) {
    header.prompt = payload.length > 0 ? new TextDecoder().decode(payload) : null;
    return;
  }
  const promptBytes = header.promptBytesInPayload;
  const cut = promptBytes === null ? 0 : promptBytes;
  if (!count(cut, PROMPT_BYTES_MAX)) {
    throw new ProtocolError('Malformed request: field "promptBytesInPayload" is invalid');
  }
  if (k !== undefined && (!count(k, 2 * PROMPT_SPECIAL_SPANS_MAX) || (k as number) % 2 !== 0)) {
    throw new ProtocolError('Malformed request: field "promptSpecialSpansInPayload" is invalid');
  }
  const spans = (k ?? 0) as number;
  const sent = (n ?? 0) as number;
  if (
    (n !== undefined && !count(n, SENT_TOKENS_MAX)) ||
    payload.length !== (cut as number) + 4 * spans + 4 * sent
  ) {
    throw new ProtocolError(
      'Malformed request: fields "sentTokensInPayload" and "promptSpecialSpansInPayload" do not match the payload',
    );
  }
  const view = new DataView(
    payload.buffer,
    payload.byteOffset + (cut as number),
    4 * (spans + sent),
  );
  if (k !== undefined) {
    header.promptSpecialSpans = Array.from(
      { length: spans },
      (_, i) => view.getUint32(4 * i, true),
    );
  }
  if (n !== undefined) {
    header.sentTokens = Array.from(
      { length: sent },
      (_, i) => view.getInt32(4 * (spans + i), true),
    );
  }
  header.prompt = promptBytes === null
    ? null
    : new TextDecoder().decode(payload.subarray(0, cut as number));
  delete header.sentTokensInPayload;
  delete header.promptSpecialSpansInPayload;
  delete header.promptBytesInPayload;
}
