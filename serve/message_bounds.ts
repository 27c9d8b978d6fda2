/**
 * The request path's bounds. Every one is sized so that no valid request reaches it: results
 * and telemetry are fixed-size, tokens stream in bounded batches, and the prompt bound is sized
 * from tokens (PROMPT_TOKENS_MAX tokens of up to PROMPT_BYTES_PER_TOKEN_MAX bytes each). A
 * module of their own, so that messages.ts (which re-exports them), its field checks and the
 * request payload read them without importing one another.
 *
 * @module
 */
/** Longest prompt, in tokens, the request path is sized for. */
export const PROMPT_TOKENS_MAX = 262_144;
/**
 * Bytes of UTF-8 text one prompt token may stand for, on average over the prompt. English
 * text averages about 4; 64 leaves room for long whitespace, code and non-Latin pieces.
 */
export const PROMPT_BYTES_PER_TOKEN_MAX = 64;
/** Largest prompt a request may carry, in bytes of UTF-8 (it travels as a frame payload). */
export const PROMPT_BYTES_MAX = PROMPT_TOKENS_MAX * PROMPT_BYTES_PER_TOKEN_MAX;
/** Largest number of tokens one request may ask to generate. */
export const GENERATE_TOKENS_MAX = 1 << 20;
/**
 * Tokens a client may say it already has: the prefiller's FirstToken, or, for a request
 * resumed after its decode worker died, every token streamed so far (at most a whole
 * generation). More than SENT_TOKENS_HEADER_MAX travel in the frame's payload.
 */
export const SENT_TOKENS_MAX = GENERATE_TOKENS_MAX;
/**
 * Special-token spans a prompt may carry (two byte offsets each, in the payload): each is one
 * prompt token, so no valid prompt has more.
 */
export const PROMPT_SPECIAL_SPANS_MAX = PROMPT_TOKENS_MAX;
/** Sent tokens that may travel in a GenerateRequest's header (the header is small). */
export const SENT_TOKENS_HEADER_MAX = 16;
/** Control frames: small headers (fixed-size messages), payloads up to a prompt and its sent tokens. */
export const CONTROL_FRAME_LIMITS = {
  headerBytesMax: 64 * 1024,
  payloadBytesMax: PROMPT_BYTES_MAX + 8 * PROMPT_SPECIAL_SPANS_MAX + 4 * SENT_TOKENS_MAX,
};
/** User-turn ends a PrefillRequest may name (the prefix cache checkpoints the last ones). */
export const TURN_ENDS_MAX = 16;
/** Tokens in one TokenBatch message. */
export const TOKEN_BATCH_TOKENS_MAX = 16;
/**
 * A TokenBatch is sent once its text reaches this many bytes, so its text stays under this
 * plus one token's piece (vocabulary pieces are far shorter than the header bound).
 */
export const TOKEN_BATCH_TEXT_BYTES_MAX = 16 * 1024;
