/**
 * A decode worker's generation of one request (serve/decode_role.ts): from a committed
 * session, continuing where the handoff left it, or, as the colocated fallback, from the
 * prompt prefilled here. Either streams TokenBatch messages and Progress, then GenerateDone;
 * a cancel ends it between steps (and, on a shared batched context, drops its queued work).
 * The caller holds the session or context and releases it afterwards.
 */
import { tokenizePrompt } from "./prompt_tokens.ts";
import { LimitExceededError } from "../core/mod.ts";
import { DecoderTelemetry } from "../core/telemetry.ts";
import type { PeerConnection } from "../transport/mod.ts";
import { type CommittedSession, continueSession, type GeneratedStep } from "./generation.ts";
import { speculationEvent } from "./speculative.ts";
import type { GenerateRequest } from "./messages.ts";
import { reportProgress, sendDone, streamTokens } from "./token_stream.ts";
import { SequenceEngine } from "./batch_loop.ts";
import type { DecodeEngine } from "./engine.ts";

/** Streams the continuation of a committed session (its telemetry carried on). */
export async function generateCommitted(
  peer: PeerConnection,
  request: GenerateRequest,
  session: CommittedSession,
  cancel: AbortSignal,
): Promise<void> {
  // Per-token logits digests are compared with a lone run: decode this session alone.
  if (request.probe) session.engine.alone = true;
  const decodePath = session.engine.path;
  const stopProgress = reportProgress(peer, request.handoffId, () => session.engine.position);
  const stopDrop = dropQueuedOnCancel(session.engine, cancel);
  try {
    const telemetry = new DecoderTelemetry();
    for (const e of session.events) telemetry.push(e);
    if (request.speculation) session.speculationMode = request.speculation;
    const steps = untilCancelled(continueSession(session, request.generateTokens), cancel);
    await streamTokens(peer, request, steps, telemetry, session.engine.model.vocab);
    if (session.speculation) {
      telemetry.push(speculationEvent(session.speculation, performance.now()));
    }
    await sendDone(
      peer,
      request.handoffId,
      { ok: true, message: null },
      telemetry.summary(),
      session.mtpReady,
      { decodePath },
    );
  } finally {
    stopDrop();
    stopProgress();
  }
}

/** Prefills the request's prompt in `engine` and streams the generation from it. */
export async function generateFromPrompt(
  peer: PeerConnection,
  request: GenerateRequest,
  engine: DecodeEngine,
  cancel: AbortSignal,
): Promise<void> {
  if (request.probe) engine.alone = true;
  const stopProgress = reportProgress(peer, request.handoffId, () => engine.position);
  const stopDrop = dropQueuedOnCancel(engine, cancel);
  try {
    const prompt = tokenizePrompt(
      engine.model.vocab,
      request.prompt!,
      request.promptSpecialSpans,
    );
    // Refused before any decode: an admitted request never runs out of cells mid-stream.
    const needed = prompt.length + request.generateTokens;
    if (needed > engine.contextTokens) {
      throw new LimitExceededError(
        `Request needs ${needed} context tokens (prompt ${prompt.length} + generate ${request.generateTokens}), this decoder has ${engine.contextTokens}`,
        { hint: "start the decode worker with a larger --ctx, or ask for fewer tokens" },
      );
    }
    const s = request.sampling!;
    const params = { temperature: s.temperature, topK: s.topK, topP: s.topP };
    const logits = await engine.prefill(prompt);
    const steps = async function* (): AsyncGenerator<GeneratedStep> {
      yield* engine.generate(logits, request.generateTokens, params, { seed: s.seed, draws: 0 });
    };
    const telemetry = new DecoderTelemetry();
    await streamTokens(
      peer,
      request,
      untilCancelled(steps(), cancel),
      telemetry,
      engine.model.vocab,
    );
    await sendDone(
      peer,
      request.handoffId,
      { ok: true, message: null },
      telemetry.summary(),
      null,
      { decodePath: engine.path },
    );
  } finally {
    stopDrop();
    stopProgress();
  }
}

/**
 * On a shared (batched) context, a cancel drops the session's queued work at once: a long
 * prompt's remaining chunks, or a decode step waiting for the next batch, would otherwise run
 * to their end before the between-steps check sees the cancel. Returns the remover.
 */
function dropQueuedOnCancel(engine: DecodeEngine, cancel: AbortSignal): () => void {
  if (!(engine instanceof SequenceEngine)) return () => {};
  const drop = () => engine.loop.cancel(engine.seq, "the request was cancelled");
  if (cancel.aborted) drop();
  else cancel.addEventListener("abort", drop, { once: true });
  return () => cancel.removeEventListener("abort", drop);
}

/** Ends `steps` with an error once `signal` aborts (checked before each step). */
async function* untilCancelled<T>(steps: AsyncIterable<T>, signal: AbortSignal): AsyncGenerator<T> {
  for await (const step of steps) {
    if (signal.aborted) throw new Error("The request was cancelled");
    yield step;
  }
}
