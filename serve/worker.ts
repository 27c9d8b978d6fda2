/**
 * A worker process: one loaded model, a bounded pool of contexts, a QUIC listener, and the
 * roles it announces (`prefill`, `decode`, `prefill+decode`). It routes each authenticated
 * peer's control messages and handoff streams to the prefill side (serve/prefill_role.ts) or
 * the decode side (serve/decode_role.ts), once the peer's trusted roles permit each message
 * (serve/authorization.ts): a refused message gets its answer (a failed outcome, or a refused
 * reservation or stream) naming the missing role, and nothing else happens.
 */
import { type HandoffTiming, ProtocolError, resolveHandoffTiming } from "../core/mod.ts";
import {
  type Capabilities,
  legacyRolesNotice,
  type PeerConnection,
  type PeerListener,
  readUdpBufferFacts,
  readUdpReceiveDropsSync,
  type Role,
  roleCovers,
} from "../transport/mod.ts";
import { HANDOFF_STREAM_ROLE, PeerAuthorization } from "./authorization.ts";
import type { DecodeHooks, DecodeRole } from "./decode_role.ts";
import type { DecodeLimits } from "./decode_session.ts";
import type { RuntimeConfig } from "./engine.ts";
import { announcedCapabilities, type ResolvedIdentity } from "./identity.ts";
import {
  type CancelRequest,
  decodeRequestPayload,
  isServeMessageType,
  parseMessage,
  type PrefillOutcome,
  type StatsRequest,
  type WorkerCounters,
  type WorkerStats,
} from "./messages.ts";
import { Node, type NodeFaults, type NodeLinkOverrides } from "./node.ts";
import { sendDone } from "./token_stream.ts";
import { EnginePool, type SessionPool } from "./pool.ts";
import type { AdmissionOptions } from "./admission.ts";
import { SequencePool } from "./batch_pool.ts";
import type { PrefillLimits } from "./prefill_session.ts";
import type { PrefillHooks, PrefillRole } from "./prefill_role.ts";
import type { PrefillQueueOptions } from "./prefill_queue.ts";
import { LocalGeneration } from "./prefill_completion.ts";
import type { PrefixCacheOptions } from "./prefix_cache.ts";
import { CORE_MESSAGE_TYPES } from "./wire.ts";
import { decodeRole, decodeSessions, prefillRole, probeIdentity } from "./_worker_setup.ts";

export interface WorkerOptions {
  role: Role;
  hostname: string;
  port: number;
  runtime: RuntimeConfig;
  /** Node identity, certificate and trust list; default per-user folder. */
  stateDir?: string;
  /**
   * Requests this worker serves at once: one context each, or, with batching on the decode
   * side, the sequences of its shared context.
   */
  sessionsMax: number;
  /**
   * Decode side: continuous batching in one shared context (`on`, the default) or a context
   * per session (`off`). Falls back to `off`, with the reason logged, for models with an MTP
   * draft and without the native shim.
   */
  batching?: "on" | "off";
  /** Most tokens in one batched step: decode tokens plus prompt chunks (default 512). */
  stepTokensMax?: number;
  /** Decode side: who may wait for a session, and how long. */
  admission?: Partial<AdmissionOptions>;
  timing?: Partial<HandoffTiming>;
  prefillLimits?: Partial<PrefillLimits>;
  /** Bounds of the prefill worker's queue (serve/prefill_queue.ts). */
  prefillQueue?: Partial<PrefillQueueOptions>;
  decodeLimits?: Partial<DecodeLimits>;
  link?: NodeLinkOverrides;
  /** A committed session waits this long for its GenerateRequest before it is released. */
  committedIdleMs?: number;
  /** One line per event, no content (default: stderr). */
  log?: (line: string) => void;
  /**
   * Tests only: false makes the worker announce no capabilities at all, as an older build
   * would; it then serves colocated requests only.
   */
  announceCapabilities?: boolean;
  /** Tests only: fault injection on this worker's connections (see NodeFaults). */
  faults?: NodeFaults;
  /** Tests only: hooks into the prefill side's requests (see PrefillHooks). */
  prefillHooks?: PrefillHooks;
  /** Tests only: hooks into the decode side's handoffs (see DecodeHooks). */
  decodeHooks?: DecodeHooks;
  /** The prefill side's exact-prefix cache (serve/prefix_cache.ts; default off). */
  prefixCache?: Partial<PrefixCacheOptions>;
  /**
   * Prefill role: after a committed handoff, the link to that decode worker is measured
   * (serve/link_loss.ts) when its newest loss probe is older than this, in ms; 0: never.
   * Default 20,000.
   */
  linkProbeAgeMs?: number;
}

export class Worker {
  #closed = false;
  readonly #peers = new Set<PeerConnection>();
  /** The host's default UDP receive buffer, read at start (null: unreadable here). */
  #udpReceiveBufferBytes: number | null = null;

  private constructor(
    readonly options: WorkerOptions,
    readonly node: Node,
    readonly pool: EnginePool,
    /** The decode side's sessions: `pool` itself, or the batched shared context. */
    readonly sessions: SessionPool,
    readonly identity: ResolvedIdentity,
    readonly capabilities: Capabilities,
    readonly listener: PeerListener,
    readonly prefill: PrefillRole | null,
    readonly decode: DecodeRole | null,
    /** A prefill-only worker's own generation (its decode worker lost, or a resume). */
    readonly local: LocalGeneration | null,
  ) {}

  /** Loads the model, opens the node and starts listening. */
  static async start(options: WorkerOptions): Promise<Worker> {
    const hostnames = [options.hostname];
    const node = await Node.open(options.stateDir, options.link, hostnames, options.faults);
    const pool = await EnginePool.open(options.runtime, options.sessionsMax);
    const { identity, capture } = await probeIdentity(options, node, pool);
    const capabilities = announcedCapabilities(
      options.role,
      identity,
      capture,
      node.link.congestionControl,
    );
    const announced = options.announceCapabilities === false ? {} : capabilities;
    const listener = node.listen(options.hostname, options.port, announced);
    const log = options.log ?? ((line: string) => console.error(line));
    const legacy = node.trust.legacyEntries().length;
    if (legacy > 0) log(legacyRolesNotice(legacy));
    const sessions = roleCovers(options.role, "decode")
      ? await decodeSessions(options, pool, log)
      : pool;
    const timing = resolveHandoffTiming(options.timing);
    const roles = { node, pool, sessions, identity, capabilities, timing, log };
    const prefill = roleCovers(options.role, "prefill") ? prefillRole(options, roles) : null;
    const decode = roleCovers(options.role, "decode") ? decodeRole(options, roles) : null;
    const worker = new Worker(
      options,
      node,
      pool,
      sessions,
      identity,
      capabilities,
      listener,
      prefill,
      decode,
      prefill && !decode ? new LocalGeneration(pool, log) : null,
    );
    worker.#udpReceiveBufferBytes = (await readUdpBufferFacts())?.receiveDefaultBytes ?? null;
    worker.#acceptLoop();
    return worker;
  }

  get addr(): { hostname: string; port: number } {
    return this.listener.addr;
  }

  /** What this worker holds now (counts only): every one but the totals returns to zero. */
  stats(): WorkerCounters {
    return {
      prefillActive: 0,
      retainedBytes: 0,
      decodeAttempts: 0,
      stagedBytes: 0,
      committedSessions: 0,
      generating: 0,
      reservationsTotal: 0,
      commitsTotal: 0,
      abortsTotal: 0,
      prefillQueued: 0,
      prefillQueuedTotal: 0,
      prefillBusyTotal: 0,
      prefillQueueWaitMsTotal: 0,
      prefillQueueWaitMsMax: 0,
      ...this.prefill?.counters,
      ...this.decode?.counters,
      ...(this.local ? { generating: this.local.running } : {}),
      contextsBusy: this.pool.busy + (this.sessions === this.pool ? 0 : this.sessions.busy),
      ...this.#decodeUsage(),
    };
  }

  /** Memory, host and decode-side usage, reported beside the counters (not summed, not held). */
  #decodeUsage(): Partial<WorkerCounters> {
    const usage = this.sessions instanceof SequencePool ? this.sessions.usage() : null;
    return {
      rssBytes: Deno.memoryUsage().rss,
      udpReceiveBufferBytes: this.#udpReceiveBufferBytes ?? undefined,
      udpReceiveDrops: readUdpReceiveDropsSync() ?? undefined,
      decodePath: this.decode ? this.sessions.path : undefined,
      ...usage,
      ...this.decode?.admission.counters,
    };
  }

  async #acceptLoop(): Promise<void> {
    for await (const peer of this.listener) {
      if (this.#closed) {
        await peer.close().catch(() => {});
        continue;
      }
      this.#peers.add(peer);
      this.#servePeer(peer).finally(() => this.#peers.delete(peer));
    }
  }

  async #servePeer(peer: PeerConnection): Promise<void> {
    const auth = new PeerAuthorization(peer.peerNodeId, this.node.trust.lookup(peer.peerNodeId));
    if (!auth.may(HANDOFF_STREAM_ROLE)) {
      this.#refuseStreams(peer, auth.refusal(HANDOFF_STREAM_ROLE, "open a handoff stream"));
    } else if (this.decode) this.decode.watchStreams(peer);
    else this.#refuseStreams(peer, "Refused: this worker has no decode role (handoff stream)");
    try {
      for await (const msg of peer) {
        const header = msg.header as Record<string, unknown>;
        const type = String(header.type);
        try {
          const refusal = auth.refusalFor(type);
          if (refusal) {
            this.#log(refusal);
            await this.#answerRefusal(peer, type, header, refusal);
            continue;
          }
          if (type === "PrefillRequest" || type === "GenerateRequest") {
            // The prompt (and a resume's sent tokens) travel as the frame's payload.
            decodeRequestPayload(header, msg.payload);
          }
          await this.#dispatch(peer, type, header);
        } catch (error) {
          this.#log(`peer ${peer.peerNodeId}: ${(error as Error).message}`);
          await this.#answerRefusal(peer, type, header, (error as Error).message);
        }
      }
    } catch {
      // Connection failed; sessions bound to it learn below.
    }
    this.decode?.peerGone(peer);
    this.prefill?.peerGone(peer);
    this.local?.peerGone(peer);
  }

  /** A peer that may not hand state to this worker: every handoff stream it opens is refused. */
  #refuseStreams(peer: PeerConnection, why: string): void {
    (async () => {
      for await (const stream of peer.incomingHandoffStreams()) {
        this.#log(why);
        await stream.refuse(why).catch(() => {});
      }
    })().catch(() => {});
  }

  async #dispatch(peer: PeerConnection, type: string, header: Record<string, unknown>) {
    if (CORE_MESSAGE_TYPES.has(type)) {
      if (!this.decode) throw new ProtocolError(`This worker has no decode role ("${type}")`);
      return await this.decode.onCoreMessage(peer, header);
    }
    if (type === "CancelRequest") {
      const cancel = parseMessage<CancelRequest>(header);
      this.local?.cancel(peer, cancel);
      this.decode?.cancelFrom(peer, cancel.handoffId, cancel.tenantId);
      return this.prefill?.cancelFrom(peer, cancel.handoffId, cancel.tenantId);
    }
    if (type === "StatsRequest") {
      const { requestId } = parseMessage<StatsRequest>(header);
      const stats: WorkerStats = { type: "WorkerStats", requestId, ...this.stats() };
      return await peer.send(stats as unknown as Record<string, unknown>);
    }
    if (!isServeMessageType(type)) {
      throw new ProtocolError(`Unknown message "${type.slice(0, 40)}"`);
    }
    if (type === "PrefillRequest") {
      if (!this.prefill) throw new ProtocolError("This worker has no prefill role");
      this.prefill.onPrefillRequest(peer, parseMessage(header));
      return;
    }
    if (type === "GenerateRequest") {
      if (this.local) return this.local.onGenerateRequest(peer, parseMessage(header));
      if (!this.decode) throw new ProtocolError("This worker has no decode role");
      this.decode.onGenerateRequest(peer, parseMessage(header));
      return;
    }
    throw new ProtocolError(`Unexpected message "${type}" for a worker`);
  }

  /**
   * A request this worker could not take (malformed, wrong role) still gets an answer when it
   * names a handoff, so the client fails at once instead of at its timeout.
   */
  async #answerRefusal(
    peer: PeerConnection,
    type: string,
    header: Record<string, unknown>,
    message: string,
  ): Promise<void> {
    const handoffId = header.handoffId;
    if (typeof handoffId !== "string" || handoffId.length === 0 || handoffId.length > 64) return;
    if (type === "ReserveRequest") {
      const attempt = Number.isSafeInteger(header.attempt) ? header.attempt : 0;
      const notice = { type: "AbortNotice", handoffId, attempt, reason: "reserve-rejected" };
      return await peer.send(notice).catch(() => {});
    }
    if (type === "GenerateRequest") {
      return await sendDone(peer, handoffId, { ok: false, message });
    }
    if (type !== "PrefillRequest") return;
    const outcome: PrefillOutcome = {
      type: "PrefillOutcome",
      handoffId,
      outcome: "failed",
      reason: "protocol-error",
      message,
      promptTokens: 0,
      telemetry: null,
    };
    await peer.send(outcome as unknown as Record<string, unknown>).catch(() => {});
  }

  #log(line: string): void {
    (this.options.log ?? ((l: string) => console.error(l)))(line);
  }

  /** Stops listening, closes peers, waits for nothing long: bounded by the close timeout. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.listener.close();
    await Promise.allSettled([
      ...[...this.#peers].map((p) => p.close()),
      this.prefill?.close(), // the shared links to decode workers
    ]);
    this.decode?.close();
    this.prefill?.prefixCache.clear(); // no persistence: checkpoints are zeroed here
  }
}
