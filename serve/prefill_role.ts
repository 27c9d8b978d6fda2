/**
 * The prefill role of a worker: takes PrefillRequests from a coordinator, checks the decode
 * worker is eligible (authenticated, capabilities, identical numerical identity), runs the
 * handoff (serve/prefill_session.ts) and answers with a PrefillOutcome. A coordinator that
 * goes away cancels its requests.
 */
import type { HandoffTiming } from "../core/mod.ts";
import { deriveTelemetry, formatTelemetry } from "../core/telemetry.ts";
import { type Capabilities, eligibleForHandoff, type PeerConnection } from "../transport/mod.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { PrefillOutcome, PrefillRequest } from "./messages.ts";
import type { Node } from "./node.ts";
import type { EnginePool } from "./pool.ts";
import { PrefillHandoff, type PrefillLimits } from "./prefill_session.ts";

interface Active {
  controller: AbortController;
  peer: PeerConnection;
  /** Set once the handoff runs (after a context was taken and the decoder reached). */
  handoff: PrefillHandoff | null;
}

export class PrefillRole {
  readonly #active = new Map<string, Active>();

  constructor(
    readonly node: Node,
    readonly pool: EnginePool,
    readonly identity: ResolvedIdentity,
    readonly capabilities: Capabilities,
    readonly timing: HandoffTiming,
    readonly limits: PrefillLimits,
    readonly log: (line: string) => void,
  ) {}

  onPrefillRequest(peer: PeerConnection, request: PrefillRequest): void {
    if (this.#active.has(request.handoffId)) {
      this.#reply(peer, failed(request, "A handoff with this id is already running", 0));
      return;
    }
    const controller = new AbortController();
    const active: Active = { controller, peer, handoff: null };
    this.#active.set(request.handoffId, active);
    this.#run(request, active)
      .catch((error) => failed(request, (error as Error).message, 0))
      .then((outcome) => this.#reply(peer, outcome))
      .finally(() => this.#active.delete(request.handoffId));
  }

  /** Cancels a running handoff (the client asked, or went away). */
  cancel(handoffId: string): void {
    this.#active.get(handoffId)?.controller.abort();
  }

  peerGone(peer: PeerConnection): void {
    for (const [id, active] of this.#active) if (active.peer === peer) this.cancel(id);
  }

  /** Handoffs running, and the bytes of exported state they retain. */
  get counters(): { prefillActive: number; retainedBytes: number } {
    let retainedBytes = 0;
    for (const active of this.#active.values()) retainedBytes += active.handoff?.retainedBytes ?? 0;
    return { prefillActive: this.#active.size, retainedBytes };
  }

  async #run(request: PrefillRequest, active: Active) {
    const cancel = active.controller.signal;
    const pooled = await this.pool.tryAcquire();
    if (!pooled) return failed(request, "The prefill worker is busy (all sessions in use)", 0);
    const prompt = pooled.engine.model.vocab.tokenize(request.prompt);
    let decoder: PeerConnection | null = null;
    try {
      try {
        decoder = await this.node.connect(request.decode, this.capabilities);
      } catch (error) {
        return {
          ...failed(
            request,
            `Cannot reach the decode worker: ${(error as Error).message}`,
            prompt.length,
          ),
          outcome: "fallback",
          reason: "connection-lost",
        } satisfies PrefillOutcome;
      }
      const eligible = eligibleForHandoff(this.capabilities, decoder.peerCapabilities, "decode");
      if (!eligible.ok) {
        this.log(`handoff ${request.handoffId}: decode worker not eligible: ${eligible.reason}`);
        return {
          ...failed(request, `Decode worker not eligible: ${eligible.reason}`, prompt.length),
          outcome: "fallback",
          reason: "capability-missing",
        } satisfies PrefillOutcome;
      }
      let first: PeerConnection | null = decoder;
      const handoff = new PrefillHandoff({
        request,
        prompt,
        engine: pooled.engine,
        draft: pooled.draft,
        identity: this.identity,
        connectDecoder: async () => {
          if (first) {
            const c = first;
            first = null;
            return c;
          }
          decoder = await this.node.connect(request.decode, this.capabilities);
          return decoder;
        },
        sourceNodeId: this.node.identity.nodeId,
        timing: this.timing,
        limits: this.limits,
        cancel,
      });
      active.handoff = handoff;
      const outcome = await handoff.run();
      const summary = formatTelemetry(deriveTelemetry({ prefiller: outcome.events, decoder: [] }), {
        side: "prefill",
      });
      this.log(
        `handoff ${request.handoffId}: ${outcome.outcome}` +
          (outcome.reason ? ` (${outcome.reason})` : "") + ` | ${summary}`,
      );
      return outcome;
    } catch (error) {
      return failed(request, (error as Error).message, prompt.length);
    } finally {
      await decoder?.close().catch(() => {});
      this.pool.release(pooled);
    }
  }

  async #reply(peer: PeerConnection, outcome: PrefillOutcome): Promise<void> {
    try {
      await peer.send(outcome as unknown as Record<string, unknown>);
    } catch {
      // The coordinator is gone; nothing to tell.
    }
  }
}

function failed(request: PrefillRequest, message: string, promptTokens: number): PrefillOutcome {
  return {
    type: "PrefillOutcome",
    handoffId: request.handoffId,
    outcome: "failed",
    reason: null,
    message,
    promptTokens,
    events: [],
    firstLogitsSha256: null,
  };
}
