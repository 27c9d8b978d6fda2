/**
 * How a decode worker answers a GenerateRequest on the control stream: TokenBatch messages
 * (at most BATCH_TOKENS_MAX tokens, none waiting longer than BATCH_WAIT_MS), then one
 * GenerateDone, which also carries a failure's one-line message.
 */
import { logitsDigest } from "./probe.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import { PieceDecoder, type Vocab } from "../ffi/mod.ts";
import type { PeerConnection } from "../transport/mod.ts";
import type { GeneratedStep } from "./generation.ts";
import type { GenerateDone, GenerateRequest, TokenBatch } from "./messages.ts";

/** Tokens per TokenBatch message, and the longest a token waits to be sent. */
const BATCH_TOKENS_MAX = 16;
const BATCH_WAIT_MS = 20;

function _emptyBatch(handoffId: string): TokenBatch {
  return { type: "TokenBatch", handoffId, tokens: [], text: "", logitsSha256: [] };
}

/** Sends every step of `steps` as TokenBatch messages; records a `token` event per step. */
export async function streamTokens(
  peer: PeerConnection,
  request: GenerateRequest,
  steps: AsyncIterable<GeneratedStep>,
  events: DecoderTelemetryEvent[],
  vocab: Vocab,
): Promise<void> {
  const pieces = new PieceDecoder(vocab);
  let batch = _emptyBatch(request.handoffId);
  let since = performance.now();
  for await (const step of steps) {
    events.push({ type: "token", atMs: performance.now() });
    batch.tokens.push(step.token);
    batch.text += pieces.push(step.token);
    if (request.probe && step.logits) batch.logitsSha256.push(await logitsDigest(step.logits));
    if (batch.tokens.length >= BATCH_TOKENS_MAX || performance.now() - since >= BATCH_WAIT_MS) {
      await peer.send(batch as unknown as Record<string, unknown>);
      batch = _emptyBatch(request.handoffId);
      since = performance.now();
    }
  }
  batch.text += pieces.flush();
  if (batch.tokens.length > 0 || batch.text) {
    await peer.send(batch as unknown as Record<string, unknown>);
  }
}

/** Sends GenerateDone; a peer that is gone is not an error here (nobody is left to tell). */
export async function sendDone(
  peer: PeerConnection,
  handoffId: string,
  result: { ok: boolean; message: string | null },
  events: DecoderTelemetryEvent[] = [],
  mtpReady: boolean | null = null,
): Promise<void> {
  const done: GenerateDone = { type: "GenerateDone", handoffId, ...result, events, mtpReady };
  await peer.send(done as unknown as Record<string, unknown>).catch(() => {});
}
