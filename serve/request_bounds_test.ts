/**
 * No bound on the request path is one a valid request can reach: the largest messages a
 * 262,144-token prompt and a 2^20-token generation can produce (built synthetically, each
 * field at its largest) encode within the control frame limits, and parse.
 */
import assert from "node:assert/strict";
import {
  ABORT_REASONS,
  type AbortReason,
  COMPONENT_KINDS,
  DecoderTelemetry,
  PrefillerTelemetry,
} from "../core/mod.ts";
import { encodeFrame } from "../transport/mod.ts";
import { TOP_LOGPROBS_MAX } from "../core/logprobs.ts";
import {
  CONTROL_FRAME_LIMITS,
  decodeRequestPayload,
  encodeRequestPayload,
  type FirstToken,
  GENERATE_TOKENS_MAX,
  type GenerateDone,
  type GenerateRequest,
  parseMessage,
  type PrefillOutcome,
  type PrefillRequest,
  PROMPT_BYTES_MAX,
  PROMPT_SPECIAL_SPANS_MAX,
  PROMPT_TOKENS_MAX,
  SENT_TOKENS_HEADER_MAX,
  SENT_TOKENS_MAX,
  TOKEN_BATCH_TEXT_BYTES_MAX,
  TOKEN_BATCH_TOKENS_MAX,
  type TokenBatch,
} from "./messages.ts";

const HANDOFF_ID = "h".repeat(64);
const DIGEST = "f".repeat(64);
/** Largest token id a vocabulary can have (llama_token is int32). */
const TOKEN_MAX = 0x7fffffff;

function headerBytes(message: object, payload?: Uint8Array): number {
  const frame = encodeFrame(message as Record<string, unknown>, payload, {
    limits: CONTROL_FRAME_LIMITS,
  });
  return frame.head.length;
}

/**
 * The prefill side's telemetry after a prompt of `tokens` prefilled one token per chunk (the
 * most chunks there can be), with every page queued, sent, staged, and retried to the limit.
 */
function prefillSummary(tokens: number, retries: number) {
  const t = new PrefillerTelemetry();
  t.push({ type: "request-start", atMs: 0 });
  let at = 1;
  for (let seq = 0; seq < tokens; seq++) {
    const bytes = 4096 + (seq % 7);
    t.push({ type: "prefill-chunk-done", atMs: at++, tokens: 1, cached: seq % 3 === 0 });
    t.push({ type: "export", atMs: at++, kind: "kv-page", bytes, durationMs: 0.25 });
    t.push({ type: "chunk-queued", atMs: at++, seq, kind: "kv-page", bytes });
    t.push({ type: "chunk-sent", atMs: at++, seq, kind: "kv-page", bytes, durationMs: 0.5 });
    t.push({ type: "chunk-staged", atMs: at++, seq, bytes });
  }
  for (const kind of COMPONENT_KINDS) {
    t.push({ type: "chunk-sent", atMs: at++, seq: tokens, kind, bytes: 2 ** 40, durationMs: 1 });
  }
  for (let i = 0; i < retries; i++) {
    t.push({ type: "retry", atMs: at++, reason: ABORT_REASONS[i % ABORT_REASONS.length] });
  }
  t.push({ type: "first-token", atMs: at++ });
  t.push({ type: "manifest-sent", atMs: at++ });
  t.push({ type: "commit-ack", atMs: at++ });
  t.push({ type: "fallback", atMs: at++, reason: "probe-failed" });
  return t.summary();
}

function decodeSummary(tokens: number) {
  const t = new DecoderTelemetry();
  t.push({ type: "manifest-received", atMs: 1 });
  for (let i = 0; i < 600; i++) {
    t.push({ type: "import", atMs: 2, kind: "kv-page", bytes: 4096, durationMs: 0.1 });
  }
  t.push({ type: "committed", atMs: 3 });
  t.push({ type: "ready", atMs: 3, target: true, mtp: true });
  for (let i = 0; i < tokens; i++) t.push({ type: "token", atMs: 4 + i * 12.345 });
  return t.summary();
}

function outcome(telemetry: PrefillOutcome["telemetry"]): PrefillOutcome {
  return {
    type: "PrefillOutcome",
    handoffId: HANDOFF_ID,
    outcome: "fallback",
    reason: "reservation-expired" satisfies AbortReason,
    message: "m".repeat(1024),
    promptTokens: PROMPT_TOKENS_MAX,
    telemetry,
  };
}

Deno.test("PrefillOutcome of a 262,144-token prompt is as small as a 16-token prompt's", () => {
  const big = headerBytes(outcome(prefillSummary(PROMPT_TOKENS_MAX, 1000)));
  const small = headerBytes(outcome(prefillSummary(16, 1)));
  assert.ok(big <= CONTROL_FRAME_LIMITS.headerBytesMax, `${big} bytes`);
  // O(1): only the widths of numbers (at most 9 bytes each) and the bounded reasons differ.
  assert.ok(big - small < 512, `grew from ${small} to ${big} bytes`);
  const parsed = parseMessage<PrefillOutcome>(
    structuredClone(outcome(prefillSummary(PROMPT_TOKENS_MAX, 3))) as unknown as Record<
      string,
      unknown
    >,
  );
  assert.equal(parsed.telemetry!.computedTokens + parsed.telemetry!.cachedTokens, 262_144);
});

Deno.test("GenerateDone of a 2^20-token generation is as small as an 8-token one's", () => {
  const done = (tokens: number): GenerateDone => ({
    type: "GenerateDone",
    handoffId: HANDOFF_ID,
    ok: false,
    message: "m".repeat(1024),
    telemetry: decodeSummary(tokens),
    mtpReady: true,
  });
  const big = headerBytes(done(GENERATE_TOKENS_MAX));
  const small = headerBytes(done(8));
  assert.ok(big <= CONTROL_FRAME_LIMITS.headerBytesMax, `${big} bytes`);
  assert.ok(big - small < 64, `grew from ${small} to ${big} bytes`);
  assert.equal(done(GENERATE_TOKENS_MAX).telemetry!.tokens, GENERATE_TOKENS_MAX);
});

const FULLEST_LOGPROB = {
  logprob: -Math.PI,
  top: Array.from(
    { length: TOP_LOGPROBS_MAX },
    () => [TOKEN_MAX, -Math.E] as [number, number],
  ),
};

Deno.test("the fullest TokenBatch and FirstToken encode within the control frame limits", () => {
  // A batch is sent once its text reaches TOKEN_BATCH_TEXT_BYTES_MAX, so its text is at most
  // that plus one more piece; 4-byte characters, and a piece as long as the whole bound.
  const text = "\u{1F600}".repeat((2 * TOKEN_BATCH_TEXT_BYTES_MAX) / 4);
  const batch: TokenBatch = {
    type: "TokenBatch",
    handoffId: HANDOFF_ID,
    tokens: new Array(TOKEN_BATCH_TOKENS_MAX).fill(TOKEN_MAX),
    text,
    logitsSha256: new Array(TOKEN_BATCH_TOKENS_MAX).fill(DIGEST),
    // Log probabilities with the most alternatives, as float64 values that need 9 bytes.
    logprobs: new Array(TOKEN_BATCH_TOKENS_MAX).fill(FULLEST_LOGPROB),
  };
  assert.ok(headerBytes(batch) <= CONTROL_FRAME_LIMITS.headerBytesMax);
  assert.equal(parseMessage<TokenBatch>({ ...batch }).tokens.length, TOKEN_BATCH_TOKENS_MAX);
  const first: FirstToken = {
    type: "FirstToken",
    handoffId: HANDOFF_ID,
    token: TOKEN_MAX,
    text: "\u{1F600}".repeat(TOKEN_BATCH_TEXT_BYTES_MAX / 2),
    logitsSha256: DIGEST,
    sentAfterPrefillMs: 1e9,
    prefillEndEpochMs: 4e12,
    logprob: FULLEST_LOGPROB,
  };
  assert.ok(headerBytes(first) <= CONTROL_FRAME_LIMITS.headerBytesMax);
  assert.equal(parseMessage<FirstToken>({ ...first }).token, TOKEN_MAX);
});

Deno.test("a 262,144-token prompt at the stated bytes per token fits the prompt path", () => {
  const prompt = "x".repeat(PROMPT_BYTES_MAX);
  const payload = new TextEncoder().encode(prompt);
  const request: PrefillRequest = {
    type: "PrefillRequest",
    handoffId: HANDOFF_ID,
    tenantId: "t".repeat(128),
    prompt,
    generateTokens: GENERATE_TOKENS_MAX,
    sampling: { temperature: 1, topK: 40, topP: 0.95, seed: 0xffffffff },
    decode: { host: "h".repeat(256), port: 65535, nodeId: "n".repeat(64) },
    probe: true,
  };
  assert.ok(PROMPT_BYTES_MAX >= PROMPT_TOKENS_MAX * 64);
  // The prompt travels as the payload; the header carries everything else.
  const { prompt: _, ...rest } = request;
  assert.ok(headerBytes({ ...rest, prompt: null }, payload) <= CONTROL_FRAME_LIMITS.headerBytesMax);
  assert.equal(parseMessage<PrefillRequest>({ ...request }).prompt.length, PROMPT_BYTES_MAX);
  const payloadMax = PROMPT_BYTES_MAX + 8 * PROMPT_SPECIAL_SPANS_MAX + 4 * SENT_TOKENS_MAX;
  assert.throws(
    () => encodeFrame({}, new Uint8Array(payloadMax + 1), { limits: CONTROL_FRAME_LIMITS }),
    /payloadBytesMax/,
  );
  const generate: GenerateRequest = {
    type: "GenerateRequest",
    handoffId: HANDOFF_ID,
    tenantId: "t".repeat(128),
    generateTokens: GENERATE_TOKENS_MAX,
    mode: "local",
    prompt,
    sampling: request.sampling,
    probe: true,
    sentTokens: new Array(SENT_TOKENS_MAX).fill(TOKEN_MAX),
    // Every prompt token a chat template's marker: the most special spans a prompt can have.
    promptSpecialSpans: Array.from({ length: 2 * PROMPT_SPECIAL_SPANS_MAX }, (_, i) => i),
  };
  assert.equal(parseMessage<GenerateRequest>({ ...generate }).sentTokens!.length, SENT_TOKENS_MAX);
  // A resume after a whole generation: the largest prompt and every token, in one frame.
  const wire = encodeRequestPayload(generate);
  assert.ok(headerBytes(wire.header) <= CONTROL_FRAME_LIMITS.headerBytesMax);
  assert.equal(wire.payload!.length, payloadMax);
  encodeFrame(wire.header, wire.payload, { limits: CONTROL_FRAME_LIMITS });
  const received = { ...wire.header };
  decodeRequestPayload(received, wire.payload!);
  const parsed = parseMessage<GenerateRequest>(received);
  assert.equal(parsed.prompt, prompt);
  assert.equal(parsed.sentTokens!.length, SENT_TOKENS_MAX);
  assert.ok(parsed.sentTokens!.every((t) => t === TOKEN_MAX));
  assert.deepEqual(parsed.promptSpecialSpans, generate.promptSpecialSpans);
});

Deno.test("a resume's sent tokens travel in the payload, the prompt before them", () => {
  const base = {
    type: "GenerateRequest" as const,
    handoffId: HANDOFF_ID,
    tenantId: "t",
    generateTokens: 64,
    mode: "local" as const,
    prompt: "héllo",
    sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
    probe: false,
  };
  const few = encodeRequestPayload({ ...base, sentTokens: [7] });
  assert.deepEqual(few.header.sentTokens, [7]); // small: still in the header
  const tokens = Array.from({ length: SENT_TOKENS_HEADER_MAX + 5 }, (_, i) => i * 1000);
  const many = encodeRequestPayload({ ...base, sentTokens: tokens });
  assert.equal(many.header.sentTokens, undefined);
  const received = { ...many.header };
  decodeRequestPayload(received, many.payload!);
  assert.deepEqual(parseMessage<GenerateRequest>(received).sentTokens, tokens);
  assert.equal(received.prompt, "héllo");
  // A header that claims more tokens than the payload holds is refused by name.
  const lying = { ...many.header, sentTokensInPayload: tokens.length + 1 };
  assert.throws(() => decodeRequestPayload(lying, many.payload!), /sentTokensInPayload/);
});

Deno.test("a chat prompt's special spans travel in the payload, between prompt and sent tokens", () => {
  const spans = [0, 3, 7, 10];
  const request: PrefillRequest = {
    type: "PrefillRequest",
    handoffId: HANDOFF_ID,
    tenantId: "t",
    prompt: "<a>héllo<b>",
    promptSpecialSpans: spans,
    generateTokens: 8,
    sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
    decode: { host: "127.0.0.1", port: 1, nodeId: "n" },
    probe: false,
  };
  const wire = encodeRequestPayload(request);
  assert.equal(wire.header.promptSpecialSpans, undefined);
  const received = { ...wire.header };
  decodeRequestPayload(received, wire.payload!);
  const parsed = parseMessage<PrefillRequest>(received);
  assert.equal(parsed.prompt, "<a>héllo<b>");
  assert.deepEqual(parsed.promptSpecialSpans, spans);
  // With sent tokens in the payload as well (a resume of a chat request).
  const tokens = Array.from({ length: SENT_TOKENS_HEADER_MAX + 1 }, (_, i) => i);
  const generate: GenerateRequest = {
    type: "GenerateRequest",
    handoffId: HANDOFF_ID,
    tenantId: "t",
    generateTokens: 8,
    mode: "local",
    prompt: request.prompt,
    promptSpecialSpans: spans,
    sampling: request.sampling,
    probe: false,
    sentTokens: tokens,
  };
  const both = encodeRequestPayload(generate);
  const got = { ...both.header };
  decodeRequestPayload(got, both.payload!);
  const g = parseMessage<GenerateRequest>(got);
  assert.deepEqual([g.prompt, g.promptSpecialSpans, g.sentTokens], [request.prompt, spans, tokens]);
  const lying = { ...wire.header, promptSpecialSpansInPayload: spans.length + 2 };
  assert.throws(() => decodeRequestPayload(lying, wire.payload!), /promptSpecialSpansInPayload/);
  assert.throws(
    () => parseMessage({ ...request, promptSpecialSpans: [1, 2, 3] }),
    /field "promptSpecialSpans"/,
  );
});

Deno.test("a TokenBatch over its token bound, or with stray digests, is refused by name", () => {
  const batch = {
    type: "TokenBatch",
    handoffId: HANDOFF_ID,
    tokens: new Array(TOKEN_BATCH_TOKENS_MAX + 1).fill(1),
    text: "",
    logitsSha256: [],
  };
  assert.throws(() => parseMessage(batch), /field "tokens"/);
  assert.throws(
    () => parseMessage({ ...batch, tokens: [1], logitsSha256: [DIGEST, DIGEST] }),
    /field "logitsSha256"/,
  );
});

Deno.test("PrefillOutcome's link loss report is checked: counts within a probe, received at most sent", () => {
  const base = outcome(prefillSummary(16, 1)) as unknown as Record<string, unknown>;
  const withLoss = (linkLoss: unknown) => ({ ...structuredClone(base), linkLoss });
  const ok = { probe: 0xffffffff, sent: 10_000, received: 9_989, lossEvents: 11, ageMs: 12.5 };
  assert.deepEqual(parseMessage<PrefillOutcome>(withLoss(ok)).linkLoss, ok);
  assert.equal(parseMessage<PrefillOutcome>(withLoss(null)).linkLoss, null);
  const bbr = { ...ok, congestionControl: "bbr" };
  assert.deepEqual(parseMessage<PrefillOutcome>(withLoss(bbr)).linkLoss, bbr);
  const rate = { ...ok, bandwidthProbe: { bytes: 8 << 20, receiveMs: 655.5 } };
  assert.deepEqual(parseMessage<PrefillOutcome>(withLoss(rate)).linkLoss, rate);
  for (
    const bad of [
      { ...ok, bandwidthProbe: { bytes: 8 << 20, receiveMs: 0 } },
      { ...ok, bandwidthProbe: { bytes: 2 ** 31, receiveMs: 10 } },
      { ...ok, bandwidthProbe: "12 MB/s" },
      { ...ok, congestionControl: "reno" },
      { ...ok, received: 10_001 },
      { ...ok, lossEvents: 12 }, // more loss events than datagrams lost
      { ...ok, sent: 0, received: 0, lossEvents: 0 },
      { ...ok, probe: -1 },
      { ...ok, ageMs: Infinity },
      { ...ok, sent: "10000" },
      "0.1%",
    ]
  ) {
    assert.throws(() => parseMessage(withLoss(bad)), /field "linkLoss"/, JSON.stringify(bad));
  }
});
