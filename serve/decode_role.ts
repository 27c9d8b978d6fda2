/**
 * The decode role of a worker: answers reservations with a fresh uncommitted session per
 * attempt (serve/decode_session.ts), matches handoff streams to them, keeps committed
 * sessions until their GenerateRequest arrives (bounded by `committedIdleMs`), and generates,
 * from a committed session or, as the fallback, by prefilling the prompt itself.
 *
 * Attempts of one handoff: at most one runs per handoff id. A reservation for an id that
 * already has a running or committed attempt is refused, unless it comes from the same
 * authenticated source worker, for the same tenant, with a higher attempt number: then it is
 * a retry (the prefiller never saw the earlier attempt's CommitAck, so the coordinator never
 * moved the request here) and the earlier attempt is cancelled or released first.
 */
import type { HandoffTiming, ParityVerdict, ReserveRequest } from "../core/mod.ts";
import type { PeerConnection } from "../transport/mod.ts";
import { DecodeHandoff, type DecodeLimits } from "./decode_session.ts";
import type { CommittedSession } from "./generation.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { GenerateRequest, PrefillQueueCounters, WorkerCounters } from "./messages.ts";
import type { Node } from "./node.ts";
import type { PooledSession, SessionPool } from "./pool.ts";
import { Admission, ADMISSION_DEFAULTS, type AdmissionOptions } from "./admission.ts";
import { sendDone } from "./token_stream.ts";
import { atMost } from "./_deadline.ts";
import { generateCommitted, generateFromPrompt } from "./_decode_generate.ts";

/** How long a GenerateRequest waits for an attempt still importing. */
const ATTEMPT_WAIT_MS = 30_000;
/** How long a superseding request waits for the attempt it cancelled to wipe its context. */
const SUPERSEDE_WAIT_MS = 2_000;

interface Attempt {
  handoff: DecodeHandoff;
  peer: PeerConnection;
  result: Promise<CommittedSession | null>;
}

interface Held {
  session: CommittedSession;
  pooled: PooledSession;
  timer: ReturnType<typeof setTimeout>;
  sourceNodeId: string;
  attempt: number;
}

type DecodeCounters = Omit<
  WorkerCounters,
  "prefillActive" | "retainedBytes" | "contextsBusy" | keyof PrefillQueueCounters
>;

/** Tests only: hooks into a handoff on this worker. Nothing in the product sets them. */
export interface DecodeHooks {
  /**
   * Replaces the reservation's parity verdict: a test stands in for two GPU devices of one
   * backend (parity not claimed), which this CPU-only machine cannot have.
   */
  parity?: (verdict: ParityVerdict) => ParityVerdict;
}

export class DecodeRole {
  /** The running attempt of each handoff id. */
  readonly #attempts = new Map<string, Attempt>();
  /** Every attempt not yet ended (a cancelled one may still be wiping). */
  readonly #live = new Set<Attempt>();
  readonly #committed = new Map<string, Held>();
  /** Generations running, by handoff id: a CancelRequest from their peer stops them. */
  readonly #running = new Map<
    string,
    { peer: PeerConnection; tenantId: string; controller: AbortController }
  >();
  /** Reservations waiting in the admission queue for a session (see `#reserve`). */
  readonly #waitingReservations = new Map<string, { peer: PeerConnection; cancel: () => void }>();
  #generating = 0;
  readonly #totals = { reservationsTotal: 0, commitsTotal: 0, abortsTotal: 0 };
  readonly admission: Admission;

  /**
   * `pool`: where sessions come from, a context each (`EnginePool`) or a sequence of the
   * continuously batched shared context (`SequencePool`); `admission` bounds who waits for one.
   */
  constructor(
    readonly node: Node,
    readonly pool: SessionPool,
    readonly identity: ResolvedIdentity,
    readonly timing: HandoffTiming,
    readonly limits: DecodeLimits,
    readonly committedIdleMs: number,
    readonly log: (line: string) => void,
    admission: Readonly<AdmissionOptions> = ADMISSION_DEFAULTS,
    readonly hooks: DecodeHooks = {},
  ) {
    this.admission = new Admission(pool, admission);
  }

  /** What the decode side holds now, and what it did since start. */
  get counters(): DecodeCounters {
    let stagedBytes = 0;
    for (const a of this.#live) stagedBytes += a.handoff.stagedBytes;
    return {
      decodeAttempts: this.#live.size,
      stagedBytes,
      committedSessions: this.#committed.size,
      generating: this.#generating,
      ...this.#totals,
    };
  }

  async onCoreMessage(peer: PeerConnection, header: Record<string, unknown>): Promise<void> {
    if (header.type === "ReserveRequest") return await this.#reserve(peer, header);
    const id = String(header.handoffId ?? "");
    const attempt = this.#attempts.get(id);
    if (attempt && attempt.peer === peer && attempt.handoff.attempt === header.attempt) {
      return attempt.handoff.deliver(header);
    }
    const waiting = this.#waitingReservations.get(id);
    if (header.type === "AbortNotice" && waiting?.peer === peer) waiting.cancel();
    const held = this.#committed.get(id);
    const fromSource = held?.sourceNodeId === peer.peerNodeId && held.attempt === header.attempt;
    if (header.type === "AbortNotice" && fromSource) {
      // The prefiller gave up before it saw our CommitAck (cancelled, lease expired): the
      // coordinator never moved the request here, so nobody will ask for this session.
      this.log(`handoff ${id}: committed session released: the prefiller aborted`);
      this.#release(id);
    }
  }

  async #reserve(peer: PeerConnection, header: Record<string, unknown>): Promise<void> {
    const request = header as unknown as ReserveRequest;
    const id = request.handoffId;
    if (typeof id !== "string" || id.length === 0 || id.length > 64) {
      this.log(`peer ${peer.peerNodeId}: reservation without a valid handoff id ignored`);
      return;
    }
    // The same peer's retry supersedes its reservation still waiting for a session.
    const waiting = this.#waitingReservations.get(id);
    if (waiting?.peer === peer) waiting.cancel();
    const refusal = await this.#clearEarlier(peer, request);
    if (refusal) return await this.#refuse(peer, request, refusal);
    const admitted = await this.admission.acquireNow(this.#reserveWaitMs > 0);
    if (admitted.ok) return this.#startAttempt(peer, request, admitted.session);
    if (this.#reserveWaitMs === 0) return await this.#refuse(peer, request, admitted.busy);
    // No sequence free: wait in the admission queue, but without holding up this peer's other
    // messages, and briefly enough that the prefiller (waiting reserveTimeoutMs for the answer)
    // hears a refusal in time to fall back.
    this.#waitForSession(peer, request).catch((error) => {
      this.log(`handoff ${id}: reservation failed: ${(error as Error).message}`);
    });
  }

  /** How long a reservation may wait for a session: half the reserve timeout, at most. */
  get #reserveWaitMs(): number {
    return Math.min(
      this.admission.options.queueWaitMs,
      Math.floor(this.timing.reserveTimeoutMs / 2),
    );
  }

  async #waitForSession(peer: PeerConnection, request: ReserveRequest): Promise<void> {
    const id = request.handoffId;
    let cancelled = false;
    const waiting = { peer, cancel: () => (cancelled = true) };
    this.#waitingReservations.set(id, waiting);
    const admitted = await this.admission.acquire(this.#reserveWaitMs);
    if (this.#waitingReservations.get(id) === waiting) this.#waitingReservations.delete(id);
    if (!admitted.ok) return await this.#refuse(peer, request, admitted.busy);
    // Given up meanwhile (the prefiller aborted, or a retry superseded it), or another attempt
    // of this id started: the session goes back unused.
    if (cancelled || this.#attempts.has(id) || this.#committed.has(id)) {
      this.admission.release(admitted.session);
      if (!cancelled) await this.#refuse(peer, request, "handoff already in progress");
      return;
    }
    this.#startAttempt(peer, request, admitted.session);
  }

  #startAttempt(peer: PeerConnection, request: ReserveRequest, pooled: PooledSession): void {
    const id = request.handoffId;
    this.#totals.reservationsTotal++;
    const handoff = new DecodeHandoff({
      request,
      peer,
      engine: pooled.engine,
      draft: pooled.draft,
      identity: this.identity,
      nodeId: this.node.identity.nodeId,
      timing: this.timing,
      limits: this.limits,
      ...(this.hooks.parity ? { parityHook: this.hooks.parity } : {}),
    });
    const attempt = { handoff, peer } as Attempt;
    this.#attempts.set(id, attempt);
    this.#live.add(attempt);
    attempt.result = this.#runAttempt(attempt, pooled);
  }

  /** Makes room for `r`: ends the earlier attempt it supersedes, or says why it may not. */
  async #clearEarlier(peer: PeerConnection, r: ReserveRequest): Promise<string | null> {
    const held = this.#committed.get(r.handoffId);
    const running = this.#attempts.get(r.handoffId);
    const earlier = held
      ? { source: held.sourceNodeId, tenant: held.session.tenantId, attempt: held.attempt }
      : running
      ? {
        source: running.peer.peerNodeId,
        tenant: running.handoff.input.request.tenantId,
        attempt: running.handoff.attempt,
      }
      : null;
    if (!earlier) return null;
    const retry = peer.peerNodeId === earlier.source && r.tenantId === earlier.tenant &&
      Number.isSafeInteger(r.attempt) && r.attempt > earlier.attempt;
    if (!retry) return `handoff already ${held ? "committed" : "in progress"} (a replay?)`;
    this.log(`handoff ${r.handoffId}: attempt ${r.attempt} supersedes attempt ${earlier.attempt}`);
    if (held) this.#release(r.handoffId);
    if (running) {
      running.handoff.cancel();
      await atMost(running.result, SUPERSEDE_WAIT_MS);
    }
    return null;
  }

  async #runAttempt(attempt: Attempt, pooled: PooledSession): Promise<CommittedSession | null> {
    const { handoff } = attempt;
    let session: CommittedSession | null = null;
    try {
      session = await handoff.run();
    } catch (error) {
      this.log(`handoff ${handoff.handoffId}: attempt failed: ${(error as Error).message}`);
    }
    this.#live.delete(attempt);
    const current = this.#attempts.get(handoff.handoffId) === attempt;
    if (current) this.#attempts.delete(handoff.handoffId);
    if (session && current) {
      this.#totals.commitsTotal++;
      this.#hold(session, pooled, attempt);
      return session;
    }
    this.#totals.abortsTotal++;
    const why = session ? "superseded" : handoff.failure ?? "aborted";
    this.log(`handoff ${handoff.handoffId}: attempt ${handoff.attempt} not committed: ${why}`);
    this.admission.release(pooled);
    return null;
  }

  async #refuse(peer: PeerConnection, r: ReserveRequest, why: string): Promise<void> {
    this.log(`handoff ${r.handoffId}: reservation (attempt ${r.attempt}) refused: ${why}`);
    const attempt = Number.isSafeInteger(r.attempt) ? r.attempt : 0;
    await peer.send({
      type: "AbortNotice",
      handoffId: r.handoffId,
      attempt,
      reason: "reserve-rejected",
    }).catch(() => {});
  }

  #hold(session: CommittedSession, pooled: PooledSession, attempt: Attempt): void {
    this.#release(session.handoffId); // never two sessions under one id
    const timer = setTimeout(() => {
      this.log(`handoff ${session.handoffId}: released after ${this.committedIdleMs} ms idle`);
      this.#release(session.handoffId);
    }, this.committedIdleMs);
    const sourceNodeId = attempt.peer.peerNodeId;
    this.#committed.set(session.handoffId, {
      session,
      pooled,
      timer,
      sourceNodeId,
      attempt: attempt.handoff.attempt,
    });
  }

  #release(handoffId: string): void {
    const held = this.#committed.get(handoffId);
    if (!held) return;
    clearTimeout(held.timer);
    this.#committed.delete(handoffId);
    this.admission.release(held.pooled);
  }

  /** Routes this peer's handoff streams to the attempt they belong to. */
  watchStreams(peer: PeerConnection): void {
    (async () => {
      for await (const stream of peer.incomingHandoffStreams()) {
        // Matched to a live reservation of this peer before any credit is granted.
        const meta = stream.meta as Record<string, unknown>;
        const attempt = this.#attempts.get(String(meta.handoffId ?? ""));
        if (attempt && attempt.peer === peer && attempt.handoff.attempt === meta.attempt) {
          attempt.handoff.attachStream(stream.accept());
        } else {
          await stream.refuse("no reservation for this handoff stream").catch(() => {});
        }
      }
    })().catch(() => {});
  }

  peerGone(peer: PeerConnection): void {
    for (const attempt of this.#live) if (attempt.peer === peer) attempt.handoff.connectionLost();
  }

  onGenerateRequest(peer: PeerConnection, request: GenerateRequest): void {
    const run = request.mode === "committed" ? this.#generateCommitted : this.#generateLocal;
    const controller = new AbortController();
    const key = request.handoffId;
    const entry = { peer, tenantId: request.tenantId, controller };
    this.#running.set(key, entry);
    this.#generating++;
    run.call(this, peer, request, controller.signal).catch(async (error) => {
      await sendDone(peer, request.handoffId, { ok: false, message: (error as Error).message });
    }).finally(() => {
      this.#generating--;
      if (this.#running.get(key) === entry) this.#running.delete(key);
    });
  }

  /**
   * A CancelRequest (the client went away): stops the generation of that handoff, or releases
   * its committed session not yet asked to generate. Honoured only from the peer that owns
   * the request and for its tenant; anything else is ignored, as for an unknown id.
   */
  cancelFrom(peer: PeerConnection, handoffId: string, tenantId?: string): void {
    const running = this.#running.get(handoffId);
    const tenantOk = (t: string) => tenantId === undefined || tenantId === t;
    if (running && running.peer.peerNodeId === peer.peerNodeId && tenantOk(running.tenantId)) {
      running.controller.abort();
      return;
    }
    const held = this.#committed.get(handoffId);
    if (held && tenantOk(held.session.tenantId)) this.#release(handoffId);
  }

  async #generateCommitted(
    peer: PeerConnection,
    request: GenerateRequest,
    cancel: AbortSignal,
  ): Promise<void> {
    // [s2-auth] Another tenant's handoff is indistinguishable from an unknown id: the same
    // answer, and no wait on its attempt; the session stays with its own tenant.
    const inFlight = this.#attempts.get(request.handoffId);
    const own = inFlight?.handoff.input.request.tenantId === request.tenantId;
    if (inFlight && own) await atMost(inFlight.result, ATTEMPT_WAIT_MS);
    const held = this.#committed.get(request.handoffId);
    if (!held || held.session.tenantId !== request.tenantId) {
      const message = "No committed session for this handoff on this decode worker";
      return await sendDone(peer, request.handoffId, { ok: false, message });
    }
    clearTimeout(held.timer);
    this.#committed.delete(request.handoffId);
    try {
      await generateCommitted(peer, request, held.session, cancel);
    } finally {
      this.admission.release(held.pooled);
    }
  }

  /**
   * The colocated fallback: prefill the prompt here. An attempt or committed session of the
   * same handoff and tenant is of no further use (the coordinator chose to recompute) and is
   * ended first, so its context returns to the pool.
   */
  async #generateLocal(
    peer: PeerConnection,
    request: GenerateRequest,
    cancel: AbortSignal,
  ): Promise<void> {
    const running = this.#attempts.get(request.handoffId);
    if (running && running.handoff.input.request.tenantId === request.tenantId) {
      running.handoff.cancel();
      await atMost(running.result, SUPERSEDE_WAIT_MS);
    }
    const held = this.#committed.get(request.handoffId);
    if (held && held.session.tenantId === request.tenantId) this.#release(request.handoffId);
    const admitted = await this.admission.acquire();
    if (!admitted.ok) {
      const message = admitted.busy;
      return await sendDone(peer, request.handoffId, { ok: false, message }, null, null, {
        busy: true,
      });
    }
    try {
      await generateFromPrompt(peer, request, admitted.session.engine, cancel);
    } finally {
      this.admission.release(admitted.session);
    }
  }

  /** Cancels running attempts and releases committed sessions. */
  close(): void {
    this.admission.close();
    for (const attempt of this.#live) attempt.handoff.cancel();
    for (const id of [...this.#committed.keys()]) this.#release(id);
  }
}
