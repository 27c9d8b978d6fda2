/**
 * How a decode worker answers a GenerateRequest on the control stream: TokenBatch messages
 * (at most TOKEN_BATCH_TOKENS_MAX tokens and about TOKEN_BATCH_TEXT_BYTES_MAX bytes of text,
 * none waiting longer than BATCH_WAIT_MS), then one GenerateDone, which also carries a
 * failure's one-line message. Every message is bounded whatever the generation's length:
 * telemetry is a fixed-size summary, and probe digests travel with their batch.
 */
import { LimitExceededError, StateValidationError } from "../core/mod.ts";
import type { DecoderTelemetry, DecoderTelemetrySummary } from "../core/telemetry.ts";
import { PieceDecoder, type Vocab } from "../ffi/mod.ts";
import type { PeerConnection } from "../transport/mod.ts";
import type { GeneratedStep } from "./generation.ts";
import {
  type GenerateDone,
  type GenerateRequest,
  PROGRESS_INTERVAL_MS,
  TOKEN_BATCH_TEXT_BYTES_MAX,
  TOKEN_BATCH_TOKENS_MAX,
  type TokenBatch,
} from "./messages.ts";
import { logitsDigest } from "./probe.ts";
import { tokenLogprob } from "../core/logprobs.ts";
import { faultPoint } from "./fault_points.ts";

/** The longest a generated token waits to be sent. */
const BATCH_WAIT_MS = 20;

function _emptyBatch(handoffId: string, logprobs: boolean): TokenBatch {
  const batch: TokenBatch = {
    type: "TokenBatch",
    handoffId,
    tokens: [],
    text: "",
    logitsSha256: [],
  };
  if (logprobs) batch.logprobs = [];
  return batch;
}

/**
 * Sends every step of `steps` as TokenBatch messages and records a `token` event per step.
 * The first `request.sentTokens.length` steps are tokens the client already has: each must
 * equal the one sent, and is not sent again (its text still feeds the piece decoder, so the
 * text that follows is the same as one stream's).
 */
export async function streamTokens(
  peer: PeerConnection,
  request: GenerateRequest,
  steps: AsyncIterable<GeneratedStep>,
  telemetry: DecoderTelemetry,
  vocab: Vocab,
): Promise<void> {
  const pieces = new PieceDecoder(vocab);
  const sent = request.sentTokens ?? [];
  let index = 0;
  const k = request.logprobs;
  let batch = _emptyBatch(request.handoffId, k !== undefined);
  let since = performance.now();
  for await (const step of steps) {
    telemetry.push({ type: "token", atMs: performance.now() });
    const text = pieces.push(step.token);
    if (index < sent.length) {
      if (step.token !== sent[index]) {
        throw new StateValidationError(
          `Token ${index} differs from the one the client already has: the continuation is not exact`,
          { hint: "both workers must run the same model and numerics; see their logs" },
        );
      }
      index++;
      continue;
    }
    index++;
    batch.tokens.push(step.token);
    batch.text += text;
    if (request.probe && step.logits) batch.logitsSha256.push(await logitsDigest(step.logits));
    if (k !== undefined) {
      batch.logprobs!.push(step.logits ? tokenLogprob(step.logits, step.token, k) : null);
    }
    const full = batch.tokens.length >= TOKEN_BATCH_TOKENS_MAX ||
      batch.text.length * 3 >= TOKEN_BATCH_TEXT_BYTES_MAX;
    if (full || performance.now() - since >= BATCH_WAIT_MS) {
      await peer.send(batch as unknown as Record<string, unknown>);
      faultPoint("token-batch-sent");
      batch = _emptyBatch(request.handoffId, k !== undefined);
      since = performance.now();
    }
  }
  batch.text += pieces.flush();
  if (batch.tokens.length > 0 || batch.text) {
    await peer.send(batch as unknown as Record<string, unknown>);
  }
}

/**
 * Sends GenerateDone. A result that cannot be sent (a local bound) is replaced by a failure
 * that says why, so the client never waits for its timeout; a peer that is gone is not an
 * error here (nobody is left to tell).
 */
export async function sendDone(
  peer: PeerConnection,
  handoffId: string,
  result: { ok: boolean; message: string | null },
  telemetry: DecoderTelemetrySummary | null = null,
  mtpReady: boolean | null = null,
  extra: Pick<GenerateDone, "decodePath" | "busy"> = {},
): Promise<void> {
  const done: GenerateDone = {
    type: "GenerateDone",
    handoffId,
    ...result,
    telemetry,
    mtpReady,
    ...extra,
  };
  await sendOrExplain(peer, done as unknown as Record<string, unknown>, (message) => ({
    type: "GenerateDone",
    handoffId,
    ok: false,
    message,
    telemetry: null,
    mtpReady: null,
  }));
}

/**
 * Sends `message`; when a local bound refuses it, sends `explain(why)` instead (a small
 * message saying the result could not be sent). Connection failures are swallowed: the peer
 * is gone and learns nothing more.
 */
export async function sendOrExplain(
  peer: PeerConnection,
  message: Record<string, unknown>,
  explain: (why: string) => Record<string, unknown>,
): Promise<void> {
  try {
    await peer.send(message);
  } catch (error) {
    if (!(error instanceof LimitExceededError)) return;
    const why = `Cannot send the ${String(message.type)} result: ${error.message}`;
    await peer.send(explain(why)).catch(() => {});
  }
}

/**
 * Sends Progress for `handoffId` every PROGRESS_INTERVAL_MS while `done()` moves; returns the
 * function that stops it.
 */
export function reportProgress(
  peer: PeerConnection,
  handoffId: string,
  done: () => number,
): () => void {
  let last = done();
  const timer = setInterval(() => {
    const now = done();
    if (now === last) return;
    last = now;
    peer.send({ type: "Progress", handoffId, done: now }).catch(() => {});
  }, PROGRESS_INTERVAL_MS);
  return () => clearInterval(timer);
}
