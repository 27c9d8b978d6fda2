/**
 * Generation on a prefill worker, for the two cases where it, not a decode worker, finishes a
 * request:
 *
 * - `completeOnPrefill`: its decode worker was lost before the commit. The prefill worker still
 *   holds the exact state (its context has the prompt and the first token, decoded by the
 *   continuation probe; the sampler has taken the first token's draw), so it continues from
 *   there: no recompute, and the same tokens the decode worker would have produced, since the
 *   decode worker continues from a copy of this very state.
 * - `LocalGeneration`: a GenerateRequest in `local` mode (the coordinator found no decode
 *   worker, or resumes a request whose decode worker died mid-generation): prefill the prompt
 *   and generate, regenerating and checking the tokens the client already has.
 *
 * Both answer exactly as a decode worker does: TokenBatch messages, then GenerateDone.
 */
import { tokenizePrompt } from "./prompt_tokens.ts";
import {
  type AbortReason,
  type SamplerState,
  sampleToken,
  type SamplingParams,
} from "../core/mod.ts";
import { DecoderTelemetry } from "../core/telemetry.ts";
import type { PeerConnection } from "../transport/mod.ts";
import type { Engine } from "./engine.ts";
import type { GeneratedStep } from "./generation.ts";
import type { CancelRequest, GenerateRequest, PrefillRequest } from "./messages.ts";
import type { EnginePool } from "./pool.ts";
import { reportProgress, sendDone, streamTokens } from "./token_stream.ts";

/**
 * Reasons that mean the decode worker is gone or stopped answering before the commit: the
 * prefill worker can then complete the request itself (PrefillRequest.completeOnDecoderLoss).
 */
export const DECODER_LOST: ReadonlySet<AbortReason> = new Set<AbortReason>([
  "connection-lost",
  "reserve-timeout",
  "commit-timeout",
  "credit-stall",
  "lease-expired",
  "reservation-expired",
]);

/** What the prefill worker continues generating from when it completes a request itself. */
export interface PrefillCompletion {
  firstToken: number;
  /** Logits after decoding the first token (the second token samples these). */
  nextLogits: Float32Array;
  /** The sampler after the first token's draw. */
  sampler: SamplerState;
}

/** Thrown into a generation loop whose request was cancelled. */
class Cancelled extends Error {}

/**
 * Streams the rest of a request whose decode worker was lost before the commit, from the
 * state this worker kept: tokens from the second (the first was sent as FirstToken).
 */
export async function completeOnPrefill(
  peer: PeerConnection,
  request: PrefillRequest,
  engine: Engine,
  completion: PrefillCompletion,
  cancel: AbortSignal,
): Promise<void> {
  const { seed: _, ...params } = request.sampling;
  const generate: GenerateRequest = {
    type: "GenerateRequest",
    handoffId: request.handoffId,
    tenantId: request.tenantId,
    generateTokens: request.generateTokens,
    mode: "local",
    prompt: null,
    sampling: request.sampling,
    probe: request.probe,
    sentTokens: [completion.firstToken],
  };
  const stopProgress = reportProgress(peer, request.handoffId, () => engine.position);
  try {
    const steps = continueFrom(engine, completion, params, request.generateTokens, cancel);
    const telemetry = new DecoderTelemetry();
    await streamTokens(peer, generate, steps, telemetry, engine.model.vocab);
    await sendDone(peer, request.handoffId, { ok: true, message: null }, telemetry.summary());
  } catch (error) {
    const message = error instanceof Cancelled
      ? "The request was cancelled"
      : (error as Error).message;
    await sendDone(peer, request.handoffId, { ok: false, message });
  } finally {
    stopProgress();
  }
}

/** The same loop as a committed session's (serve/generation.ts), on this worker's context. */
async function* continueFrom(
  engine: Engine,
  c: PrefillCompletion,
  params: SamplingParams,
  n: number,
  cancel: AbortSignal,
): AsyncGenerator<GeneratedStep> {
  if (n <= 0) return;
  const vocab = engine.model.vocab;
  yield { token: c.firstToken, logits: null };
  if (vocab.isEog(c.firstToken)) return;
  const sampler = { ...c.sampler };
  let logits = c.nextLogits;
  for (let i = 1; i < n; i++) {
    if (cancel.aborted) throw new Cancelled();
    const token = sampleToken(logits, params, sampler);
    yield { token, logits };
    if (vocab.isEog(token) || i === n - 1) return;
    logits = await engine.step(token);
  }
}

/**
 * Prefills `request.prompt` on `engine` and streams the generation (regenerating and checking
 * the tokens the client already has), then GenerateDone: a decode worker's colocated path.
 */
export async function generateHere(
  peer: PeerConnection,
  request: GenerateRequest,
  engine: Engine,
  cancel: AbortSignal,
): Promise<void> {
  const stopProgress = reportProgress(peer, request.handoffId, () => engine.position);
  try {
    const prompt = tokenizePrompt(engine.model.vocab, request.prompt!, request.promptSpecialSpans);
    const { seed, ...params } = request.sampling!;
    const logits = await engine.prefill(prompt);
    const n = request.generateTokens;
    const steps = async function* (): AsyncGenerator<GeneratedStep> {
      for await (const step of engine.generate(logits, n, params, { seed, draws: 0 })) {
        if (cancel.aborted) throw new Cancelled();
        yield step;
      }
    };
    const telemetry = new DecoderTelemetry();
    await streamTokens(peer, request, steps(), telemetry, engine.model.vocab);
    await sendDone(peer, request.handoffId, { ok: true, message: null }, telemetry.summary());
  } finally {
    stopProgress();
  }
}

/**
 * GenerateRequests in `local` mode on a worker without the decode role: the colocated path
 * on the prefill worker (its decode worker is dead or unreachable). Bounded by the worker's
 * context pool; a request from a connection that ends, or a CancelRequest, stops it.
 */
export class LocalGeneration {
  readonly #running = new Map<
    string,
    { peer: PeerConnection; controller: AbortController; tenantId: string }
  >();

  constructor(readonly pool: EnginePool, readonly log: (line: string) => void) {}

  /** Generations running now. */
  get running(): number {
    return this.#running.size;
  }

  onGenerateRequest(peer: PeerConnection, request: GenerateRequest): void {
    if (request.mode !== "local" || request.prompt === null || request.sampling === null) {
      const message =
        "This worker has no decode role: it serves GenerateRequests in local mode only";
      sendDone(peer, request.handoffId, { ok: false, message }).catch(() => {});
      return;
    }
    if (this.#running.has(request.handoffId)) {
      const message = "A generation with this id is already running";
      sendDone(peer, request.handoffId, { ok: false, message }).catch(() => {});
      return;
    }
    const controller = new AbortController();
    this.#running.set(request.handoffId, { peer, controller, tenantId: request.tenantId });
    this.#run(peer, request, controller.signal)
      .catch(async (error) => {
        const message = error instanceof Cancelled
          ? "The request was cancelled"
          : (error as Error).message;
        await sendDone(peer, request.handoffId, { ok: false, message });
      })
      .finally(() => this.#running.delete(request.handoffId));
  }

  /** Honoured only from the peer that sent the request (and for its tenant, when named). */
  cancel(from: PeerConnection, message: CancelRequest): void {
    const running = this.#running.get(message.handoffId);
    if (!running || running.peer.peerNodeId !== from.peerNodeId) return;
    if (message.tenantId !== undefined && message.tenantId !== running.tenantId) return;
    running.controller.abort();
  }

  peerGone(peer: PeerConnection): void {
    for (const r of this.#running.values()) if (r.peer === peer) r.controller.abort();
  }

  async #run(peer: PeerConnection, request: GenerateRequest, cancel: AbortSignal): Promise<void> {
    const pooled = await this.pool.tryAcquire();
    if (!pooled) {
      const message = "The prefill worker is busy (all sessions in use)";
      return await sendDone(peer, request.handoffId, { ok: false, message });
    }
    this.log(
      `handoff ${request.handoffId}: generating here (local mode, ${
        request.sentTokens?.length ?? 0
      } tokens already sent)`,
    );
    try {
      await generateHere(peer, request, pooled.engine, cancel);
    } finally {
      this.pool.release(pooled);
    }
  }
}
