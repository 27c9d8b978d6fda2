/**
 * A request's prompt to tokens, the same on every worker and on the coordinator (which counts
 * them): text is tokenized as text (never parsing special tokens, so a client's text cannot
 * become a control token), except the spans a chat template wrote as special-token markers
 * (api/template_markers.ts), each of which becomes its one special token. BOS is added when
 * the model asks for it. Without spans this is exactly `vocab.tokenize(prompt)`; with them it
 * equals llama.cpp's special-parsing tokenization of the same text when the text outside the
 * spans holds no marker (llama.cpp tokenizes the text between special tokens fragment by
 * fragment, as done here).
 */
import { ProtocolError } from "../core/mod.ts";
import type { Vocab } from "../ffi/mod.ts";

/**
 * Tokens of `prompt`, with `specialSpans` (flat `[start, end, ...]` UTF-8 byte offsets,
 * ascending, not overlapping) tokenized as special tokens. Throws ProtocolError naming what is
 * wrong when a span is out of order, cuts a character, or is not exactly one special token.
 */
export function tokenizePrompt(
  vocab: Vocab,
  prompt: string,
  specialSpans: readonly number[] = [],
): Int32Array {
  if (specialSpans.length === 0) return vocab.tokenize(prompt);
  const bytes = new TextEncoder().encode(prompt);
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const text = (from: number, to: number) => {
    try {
      return decoder.decode(bytes.subarray(from, to));
    } catch {
      throw new ProtocolError(
        `Malformed request: a special span cuts a UTF-8 character at byte ${from} or ${to}`,
      );
    }
  };
  if (specialSpans.length % 2 !== 0) {
    throw new ProtocolError("Malformed request: special spans come in start/end pairs");
  }
  const out: number[] = vocab.addBos ? [vocab.bos] : [];
  let at = 0;
  for (let i = 0; i < specialSpans.length; i += 2) {
    const start = specialSpans[i];
    const end = specialSpans[i + 1];
    if (!Number.isSafeInteger(start) || start < at || end <= start || end > bytes.length) {
      throw new ProtocolError(
        `Malformed request: special span ${
          i / 2
        } (${start}..${end}) is out of order or outside the ${bytes.length}-byte prompt`,
      );
    }
    if (start > at) out.push(...vocab.tokenize(text(at, start), false, false));
    const special = vocab.tokenize(text(start, end), false, true);
    if (special.length !== 1 || !vocab.isControl(special[0])) {
      throw new ProtocolError(
        `Malformed request: special span ${i / 2} (${start}..${end}) is not one control token`,
      );
    }
    out.push(special[0]);
    at = end;
  }
  if (at < bytes.length) out.push(...vocab.tokenize(text(at, bytes.length), false, false));
  return Int32Array.from(out);
}
