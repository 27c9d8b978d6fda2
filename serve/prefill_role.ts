/**
 * The prefill role of a worker: takes PrefillRequests from a coordinator, checks the decode
 * worker is eligible (authenticated, capabilities, identical numerical identity), runs the
 * handoff (serve/prefill_session.ts) and answers with a PrefillOutcome. The first token goes
 * to the coordinator the moment prefill ends (FirstToken), before the rest of the state moves;
 * Progress messages say the prefill is moving while it runs. A coordinator that goes away
 * cancels its requests.
 *
 * Up to `sessionsMax` prompts prefill at once, each in its own context streaming its own
 * pages; more wait in a bounded FIFO queue (serve/prefill_queue.ts), sending Progress with
 * `queued: true` so the coordinator's idle timeout holds while they wait; beyond its bounds
 * the answer is `busy` (the coordinator then recomputes colocated, a named fallback).
 */
import type { DecoderLinkLoss } from "./link_loss.ts";
import { CongestionChoice } from "./congestion_choice.ts";
import { tokenizePrompt } from "./prompt_tokens.ts";
import type { HandoffTiming } from "../core/mod.ts";
import { deriveTelemetry, formatTelemetry } from "../core/telemetry.ts";
import {
  type Capabilities,
  eligibleForHandoff,
  type PeerConnection,
  rolesOf,
} from "../transport/mod.ts";
import type { ResolvedIdentity } from "./identity.ts";
import {
  type PrefillOutcome,
  type PrefillQueueCounters,
  type PrefillRequest,
  type Progress,
  PROGRESS_INTERVAL_MS,
} from "./messages.ts";
import type { Node } from "./node.ts";
import type { EnginePool, PooledEngine } from "./pool.ts";
import { PrefillHandoff, type PrefillLimits } from "./prefill_session.ts";
import { completeOnPrefill, generateHere } from "./prefill_completion.ts";
import { sendFirstToken } from "./_first_token.ts";
import { localRequest } from "./_worker_requests.ts";
import { reportProgress, sendOrExplain } from "./token_stream.ts";
import { PrefillQueue, type PrefillQueueOptions } from "./prefill_queue.ts";
import { type PeerLink, PeerLinks } from "./peer_links.ts";
import { DecoderChannel } from "./decoder_channel.ts";
import { DEFAULT_PREFIX_CACHE, PrefixCache, type PrefixPlan } from "./prefix_cache.ts";

/** Tests only: hooks into a request's life on this worker. Nothing in the product sets them. */
export interface PrefillHooks {
  /** Awaited once a request holds its context, before it prefills (a test holds it there). */
  admitted?: (handoffId: string) => Promise<void>;
  /** Replaces the probe digest sent to the decode worker (a test makes the two differ). */
  probeDigest?: (logitsSha256: string) => string;
}

interface Active {
  controller: AbortController;
  peer: PeerConnection;
  tenantId: string;
  /** Set once the request holds a context (it left the queue). */
  running: boolean;
  /** Set once the handoff runs (after a context was taken and the decoder reached). */
  handoff: PrefillHandoff | null;
}

export class PrefillRole {
  readonly #active = new Map<string, Active>();
  readonly #queue: PrefillQueue<PooledEngine>;
  /**
   * One authenticated link per decode peer, shared by every handoff to it (each handoff has
   * its own mailbox and handoff stream on it), with the peer's health and reconnect backoff.
   */
  readonly links: PeerLinks;
  /** The congestion controller each decode worker's link sends with (`serve --congestion-control`). */
  readonly congestion: CongestionChoice;

  constructor(
    readonly node: Node,
    readonly pool: EnginePool,
    readonly identity: ResolvedIdentity,
    readonly capabilities: Capabilities,
    readonly timing: HandoffTiming,
    readonly limits: PrefillLimits,
    readonly log: (line: string) => void,
    queue: PrefillQueueOptions,
    readonly hooks: PrefillHooks = {},
    /** The exact-prefix cache (serve/prefix_cache.ts); off at prefixCacheBytesMax 0. */
    readonly prefixCache: PrefixCache = new PrefixCache(
      DEFAULT_PREFIX_CACHE,
      identity.numerical.family,
    ),
    /** Measures the links to decode workers after handoffs (null: never). */
    readonly linkLoss: DecoderLinkLoss | null = null,
  ) {
    this.#queue = new PrefillQueue(queue, () => pool.tryAcquire(), (p) => pool.release(p));
    this.congestion = new CongestionChoice(
      node.link.congestionControl,
      node.link.bbrLossFractionMin,
    );
    this.links = new PeerLinks(
      (to) => node.connect(to, capabilities, this.congestion.for(to.nodeId)),
      node.link.peerLinks,
    );
    if (linkLoss) linkLoss.onProbe = (to, sent, events) => this.#afterLossProbe(to, sent, events);
  }

  /**
   * `auto`: a loss probe that changes the decoder link's controller replaces the link; the
   * handoffs on it finish there, new ones go over the new one.
   */
  #afterLossProbe(decoderNodeId: string, sent: number, lossEvents: number): void {
    const now = this.congestion.afterProbe(decoderNodeId, sent, lossEvents);
    if (now === null) return;
    this.log(
      `link to decode worker ${decoderNodeId}: ${
        now === "bbr" ? "loss measured" : "no loss measured"
      } (${lossEvents} loss events in ${sent} datagrams, bbrLossFractionMin ${this.congestion.bbrLossFractionMin}): ` +
        `new handoffs go over a ${now === "bbr" ? "BBR" : "Cubic"} connection`,
    );
    this.links.retire(decoderNodeId);
  }

  /** Closes the links to decode workers (each bounded by its close timeout). */
  async close(): Promise<void> {
    this.linkLoss?.close();
    await this.links.close();
  }

  onPrefillRequest(peer: PeerConnection, request: PrefillRequest): void {
    if (this.#active.has(request.handoffId)) {
      this.#reply(peer, failed(request, "A handoff with this id is already running", 0));
      return;
    }
    const controller = new AbortController();
    const active: Active = {
      controller,
      peer,
      tenantId: request.tenantId,
      running: false,
      handoff: null,
    };
    this.#active.set(request.handoffId, active);
    this.#run(request, active)
      .catch((error) => failed(request, (error as Error).message, 0))
      .then((outcome) => outcome && this.#reply(peer, outcome))
      .finally(() => this.#active.delete(request.handoffId));
  }

  /** Cancels a running or queued handoff (the client went away). */
  cancel(handoffId: string): void {
    this.#active.get(handoffId)?.controller.abort();
  }

  /**
   * A CancelRequest: honoured only from the coordinator node that sent the request, and for
   * its tenant when the request names one; anything else is ignored, as for an unknown id.
   */
  cancelFrom(peer: PeerConnection, handoffId: string, tenantId?: string): void {
    const active = this.#active.get(handoffId);
    if (!active || active.peer.peerNodeId !== peer.peerNodeId) return;
    if (tenantId !== undefined && tenantId !== active.tenantId) return;
    active.controller.abort();
  }

  peerGone(peer: PeerConnection): void {
    for (const [id, active] of this.#active) if (active.peer === peer) this.cancel(id);
  }

  /** Handoffs running, the bytes of exported state they retain, and the queue. */
  get counters(): { prefillActive: number; retainedBytes: number } & PrefillQueueCounters {
    let retainedBytes = 0;
    let running = 0;
    for (const active of this.#active.values()) {
      retainedBytes += active.handoff?.retainedBytes ?? 0;
      if (active.running) running++;
    }
    return {
      prefillActive: running,
      retainedBytes,
      prefillQueued: this.#queue.depth,
      ...this.#queue.totals,
    };
  }

  /** Waits for a context (bounded, see PrefillQueue), saying so with Progress meanwhile. */
  async #admit(request: PrefillRequest, active: Active) {
    const queued: Progress = {
      type: "Progress",
      handoffId: request.handoffId,
      done: 0,
      queued: true,
    };
    const timer = setInterval(() => {
      active.peer.send(queued as unknown as Record<string, unknown>).catch(() => {});
    }, PROGRESS_INTERVAL_MS);
    try {
      return await this.#queue.admit(active.controller.signal);
    } finally {
      clearInterval(timer);
    }
  }

  async #run(request: PrefillRequest, active: Active): Promise<PrefillOutcome | null> {
    const admission = await this.#admit(request, active);
    if (!admission.ok) {
      this.log(`handoff ${request.handoffId}: not admitted: ${admission.message}`);
      const outcome = failed(request, admission.message, 0);
      return admission.why === "cancelled"
        ? { ...outcome, reason: "cancelled" }
        : { ...outcome, outcome: "busy" };
    }
    active.running = true;
    try {
      return await this.#prefill(request, active, admission.slot);
    } finally {
      this.pool.release(admission.slot);
      this.#queue.wake();
    }
  }

  async #prefill(
    request: PrefillRequest,
    active: Active,
    pooled: PooledEngine,
  ): Promise<PrefillOutcome | null> {
    const cancel = active.controller.signal;
    await this.hooks.admitted?.(request.handoffId);
    if (cancel.aborted) {
      return { ...failed(request, "The request was cancelled", 0), reason: "cancelled" };
    }
    let prompt: Int32Array;
    try {
      prompt = tokenizePrompt(
        pooled.engine.model.vocab,
        request.prompt,
        request.promptSpecialSpans,
      );
    } catch (error) {
      return failed(request, (error as Error).message, 0);
    }
    const stopProgress = reportProgress(
      active.peer,
      request.handoffId,
      () => pooled.engine.position,
    );
    try {
      const checked = await this.#decoderLink(request, prompt, active, pooled);
      if (!("link" in checked)) return checked.outcome;
      const prefix = await this.#restorePrefix(request, prompt, pooled);
      return await this.#handOff(request, active, pooled, { prompt, prefix, link: checked.link });
    } catch (error) {
      return failed(request, (error as Error).message, prompt.length);
    } finally {
      stopProgress();
    }
  }

  /**
   * Runs the handoff over the checked link (a retry reconnects), sending the first token the
   * moment prefill ends; the outcome follows it. The handoff leaves the link at the end.
   */
  async #handOff(
    request: PrefillRequest,
    active: Active,
    pooled: PooledEngine,
    start: { prompt: Int32Array; prefix: PrefixPlan; link: PeerLink },
  ): Promise<PrefillOutcome | null> {
    let first: PeerLink | null = start.link;
    let decoder: DecoderChannel | null = null;
    let firstTokenSent: Promise<void> = Promise.resolve();
    try {
      const handoff = new PrefillHandoff({
        prefix: start.prefix,
        request,
        prompt: start.prompt,
        engine: pooled.engine,
        draft: pooled.draft,
        identity: this.identity,
        connectDecoder: async (failed) => {
          // A link retired (its controller changed) and closed before this handoff subscribed
          // to it is passed over for the live one.
          const usable = first?.retired && first.lost.aborted ? null : first;
          const next = usable ??
            await this.links.reconnect(request.decode, failed?.link ?? null);
          first = null;
          decoder = new DecoderChannel(next, request.handoffId);
          return decoder;
        },
        sourceNodeId: this.node.identity.nodeId,
        ...(this.hooks.probeDigest ? { probeDigestHook: this.hooks.probeDigest } : {}),
        timing: this.timing,
        limits: this.limits,
        cancel: active.controller.signal,
        onFirstToken: (token, logits, prefillEndMs) => {
          firstTokenSent = sendFirstToken(active.peer, request, pooled.engine, {
            token,
            logits,
            prefillEndMs,
          });
        },
      });
      active.handoff = handoff;
      const outcome = await handoff.run();
      // The newest loss probe of this decoder's link rides with the outcome; a committed
      // handoff may start the next one, in the background.
      const report = this.linkLoss?.report(request.decode.nodeId) ?? null;
      outcome.linkLoss = report &&
        { ...report, congestionControl: this.congestion.for(request.decode.nodeId) };
      const used = (decoder as DecoderChannel | null)?.link.conn;
      if (outcome.outcome === "committed" && used) this.linkLoss?.afterHandoff(used);
      // The outcome follows the first token on the same stream, never overtakes it.
      await firstTokenSent;
      return await this.#settle(request, active, pooled, handoff, outcome);
    } finally {
      await firstTokenSent;
      // The handoff leaves the shared link (which stays open for the next handoff).
      (decoder as DecoderChannel | null)?.close();
    }
  }

  /** Restores a cached prefix of this tenant into the context: only the rest computes. */
  async #restorePrefix(request: PrefillRequest, prompt: Int32Array, pooled: PooledEngine) {
    const prefix = await this.prefixCache.prepare(
      request.tenantId,
      prompt,
      pooled.engine,
      pooled.draft,
      request.turnEnds && {
        text: request.prompt,
        turnEnds: request.turnEnds,
        specialSpans: request.promptSpecialSpans,
      },
    );
    if (prefix.off && this.prefixCache.options.prefixCacheBytesMax > 0) {
      this.log(`handoff ${request.handoffId}: ${prefix.off}`);
    }
    return prefix;
  }

  /**
   * After the handoff ran: the request finished here from the state this context still holds
   * when the decode worker was lost before the commit (null), else the outcome, logged.
   */
  async #settle(
    request: PrefillRequest,
    active: Active,
    pooled: PooledEngine,
    handoff: PrefillHandoff,
    outcome: PrefillOutcome,
  ): Promise<PrefillOutcome | null> {
    if (handoff.completion) {
      // See serve/prefill_completion.ts.
      this.log(`handoff ${request.handoffId}: ${outcome.message}`);
      await this.#reply(active.peer, outcome);
      const cancel = active.controller.signal;
      await completeOnPrefill(active.peer, request, pooled.engine, handoff.completion, cancel);
      return null;
    }
    const summary = formatTelemetry(
      deriveTelemetry({ prefiller: outcome.telemetry ?? [], decoder: [] }),
      { side: "prefill" },
    );
    this.log(
      `handoff ${request.handoffId}: ${outcome.outcome}` +
        (outcome.reason ? ` (${outcome.reason})` : "") + ` | ${summary}`,
    );
    return outcome;
  }

  /**
   * The link to the request's decode worker, checked: trusted here as a decode worker,
   * reachable and eligible. Otherwise the outcome to answer with (a named fallback), or null
   * when the request already ran here (an unreachable decoder, `completeOnDecoderLoss`).
   */
  async #decoderLink(
    request: PrefillRequest,
    prompt: Int32Array,
    active: Active,
    pooled: PooledEngine,
  ): Promise<{ link: PeerLink } | { outcome: PrefillOutcome | null }> {
    const fallback = (message: string, reason: "capability-missing" | "connection-lost") => ({
      outcome: {
        ...failed(request, message, prompt.length),
        outcome: "fallback",
        reason,
      } satisfies PrefillOutcome,
    });
    // State goes only to a peer trusted here as a decode worker (an untrusted one fails to
    // connect below, with its own message).
    const target = this.node.trust.lookup(request.decode.nodeId);
    // No longer trusted here: a link made before is not used (the connect below refuses).
    if (!target) this.links.forget(request.decode);
    if (target && !rolesOf(target).has("decode")) {
      const message = `the decode worker ${request.decode.nodeId} is trusted on the prefill ` +
        `worker, but not as "decode": add the role there with \`skippy-disagg trust add ` +
        `<its card> --roles decode\``;
      this.log(`handoff ${request.handoffId}: ${message}`);
      return fallback(message, "capability-missing");
    }
    let link: PeerLink;
    try {
      link = await this.links.get(request.decode);
    } catch (error) {
      if (request.completeOnDecoderLoss) {
        // Nothing was prefilled yet: run the whole request here (colocated on this worker).
        const message = `the decode worker is unreachable (${
          (error as Error).message
        }); ran on the prefill worker`;
        this.log(`handoff ${request.handoffId}: ${message}`);
        await this.#reply(active.peer, {
          ...failed(request, message, prompt.length),
          outcome: "fallback",
          reason: "connection-lost",
          completedHere: true,
        });
        const cancel = active.controller.signal;
        await generateHere(active.peer, localRequest(request), pooled.engine, cancel);
        return { outcome: null };
      }
      return fallback(
        `Cannot reach the decode worker: ${(error as Error).message}`,
        "connection-lost",
      );
    }
    const eligible = eligibleForHandoff(this.capabilities, link.peerCapabilities, "decode");
    if (!eligible.ok) {
      this.log(`handoff ${request.handoffId}: decode worker not eligible: ${eligible.reason}`);
      return fallback(`Decode worker not eligible: ${eligible.reason}`, "capability-missing");
    }
    return { link };
  }

  /** Sends the outcome; one that cannot be sent is replaced by a failure saying why. */
  async #reply(peer: PeerConnection, outcome: PrefillOutcome): Promise<void> {
    await sendOrExplain(peer, outcome as unknown as Record<string, unknown>, (message) => ({
      ...failed({ handoffId: outcome.handoffId } as PrefillRequest, message, outcome.promptTokens),
      reason: "protocol-error",
    }));
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
    telemetry: null,
  };
}
