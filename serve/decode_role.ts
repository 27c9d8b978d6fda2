/**
 * The decode role of a worker: answers reservations with a fresh uncommitted session per
 * attempt (serve/decode_session.ts), matches handoff streams to them, keeps committed
 * sessions until their GenerateRequest arrives (bounded by `committedIdleMs`), and generates,
 * from a committed session or, as the fallback, by prefilling the prompt itself.
 */
import type { HandoffTiming } from "../core/mod.ts";
import { createHash } from "node:crypto";
import type { PeerConnection } from "../transport/mod.ts";
import { PieceDecoder } from "../ffi/mod.ts";
import { type CommittedSession, DecodeHandoff, type DecodeLimits } from "./decode_session.ts";
import { continueSession, type GeneratedStep } from "./generation.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { GenerateDone, GenerateRequest, TokenBatch } from "./messages.ts";
import type { Node } from "./node.ts";
import type { EnginePool, PooledEngine } from "./pool.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";

/** Tokens per TokenBatch message, and the longest a token waits to be sent. */
const BATCH_TOKENS_MAX = 16;
const BATCH_WAIT_MS = 20;
/** How long a GenerateRequest waits for an attempt still importing. */
const ATTEMPT_WAIT_MS = 30_000;

interface Attempt {
  handoff: DecodeHandoff;
  peer: PeerConnection;
  result: Promise<CommittedSession | null>;
}

interface Held {
  session: CommittedSession;
  pooled: PooledEngine;
  timer: ReturnType<typeof setTimeout>;
}

export class DecodeRole {
  readonly #attempts = new Map<string, Attempt>();
  readonly #committed = new Map<string, Held>();

  constructor(
    readonly node: Node,
    readonly pool: EnginePool,
    readonly identity: ResolvedIdentity,
    readonly timing: HandoffTiming,
    readonly limits: DecodeLimits,
    readonly committedIdleMs: number,
    readonly log: (line: string) => void,
  ) {}

  async onCoreMessage(peer: PeerConnection, header: Record<string, unknown>): Promise<void> {
    const id = String(header.handoffId ?? "");
    if (header.type === "ReserveRequest") return await this.#reserve(peer, header);
    const attempt = this.#attempts.get(id);
    if (attempt && attempt.peer === peer && attempt.handoff.attempt === header.attempt) {
      attempt.handoff.deliver(header);
    }
  }

  async #reserve(peer: PeerConnection, header: Record<string, unknown>): Promise<void> {
    const id = String(header.handoffId ?? "");
    const attemptNo = Number(header.attempt ?? 0);
    if (this.#committed.has(id)) {
      // A replayed reservation for a handoff this decoder already committed: refuse it.
      return await this.#refuse(peer, id, attemptNo);
    }
    const pooled = await this.pool.tryAcquire();
    if (!pooled) return await this.#refuse(peer, id, attemptNo);
    const handoff = new DecodeHandoff({
      request: header as never,
      peer,
      engine: pooled.engine,
      draft: pooled.draft,
      identity: this.identity,
      nodeId: this.node.identity.nodeId,
      timing: this.timing,
      limits: this.limits,
    });
    const result = handoff.run().then((session) => {
      if (this.#attempts.get(id)?.handoff === handoff) this.#attempts.delete(id);
      if (session) this.#hold(session, pooled);
      else {
        this.log(`handoff ${id}: attempt ${attemptNo} not committed: ${handoff.failure ?? "aborted"}`);
        this.pool.release(pooled);
      }
      return session;
    });
    this.#attempts.set(id, { handoff, peer, result });
  }

  async #refuse(peer: PeerConnection, handoffId: string, attempt: number): Promise<void> {
    await peer.send({ type: "AbortNotice", handoffId, attempt, reason: "reserve-rejected" })
      .catch(() => {});
  }

  #hold(session: CommittedSession, pooled: PooledEngine): void {
    const timer = setTimeout(() => {
      this.log(`handoff ${session.handoffId}: released after ${this.committedIdleMs} ms idle`);
      this.#release(session.handoffId);
    }, this.committedIdleMs);
    this.#committed.set(session.handoffId, { session, pooled, timer });
  }

  #release(handoffId: string): void {
    const held = this.#committed.get(handoffId);
    if (!held) return;
    clearTimeout(held.timer);
    this.#committed.delete(handoffId);
    this.pool.release(held.pooled);
  }

  /** Routes this peer's handoff streams to the attempt they belong to. */
  watchStreams(peer: PeerConnection): void {
    (async () => {
      for await (const receiver of peer.incomingHandoffStreams()) {
        const meta = receiver.meta as Record<string, unknown>;
        const attempt = this.#attempts.get(String(meta.handoffId ?? ""));
        if (attempt && attempt.peer === peer && attempt.handoff.attempt === meta.attempt) {
          attempt.handoff.attachStream(receiver);
        } else {
          await receiver.abort("no reservation for this handoff stream").catch(() => {});
        }
      }
    })().catch(() => {});
  }

  peerGone(peer: PeerConnection): void {
    for (const attempt of this.#attempts.values()) {
      if (attempt.peer === peer) attempt.handoff.connectionLost();
    }
  }

  onGenerateRequest(peer: PeerConnection, request: GenerateRequest): void {
    const run = request.mode === "committed" ? this.#generateCommitted : this.#generateLocal;
    run.call(this, peer, request).catch(async (error) => {
      await this.#done(peer, request.handoffId, false, (error as Error).message, [], null);
    });
  }

  async #generateCommitted(peer: PeerConnection, request: GenerateRequest): Promise<void> {
    const inFlight = this.#attempts.get(request.handoffId);
    if (inFlight) {
      await Promise.race([inFlight.result, new Promise((r) => setTimeout(r, ATTEMPT_WAIT_MS))]);
    }
    const held = this.#committed.get(request.handoffId);
    if (!held) {
      return await this.#done(peer, request.handoffId, false,
        "No committed session for this handoff on this decode worker", [], null);
    }
    if (held.session.tenantId !== request.tenantId) {
      // Another tenant's request: refuse it, and leave the session to its own tenant.
      return await this.#done(peer, request.handoffId, false,
        "This handoff belongs to another tenant", [], null);
    }
    clearTimeout(held.timer);
    this.#committed.delete(request.handoffId);
    try {
      const events = [...held.session.events];
      await this.#stream(peer, request, continueSession(held.session, request.generateTokens), events, held.pooled);
      await this.#done(peer, request.handoffId, true, null, events, held.session.mtpReady);
    } finally {
      this.pool.release(held.pooled);
    }
  }

  async #generateLocal(peer: PeerConnection, request: GenerateRequest): Promise<void> {
    const pooled = await this.pool.tryAcquire();
    if (!pooled) {
      return await this.#done(peer, request.handoffId, false,
        "The decode worker is busy (all sessions in use)", [], null);
    }
    try {
      const engine = pooled.engine;
      const prompt = engine.model.vocab.tokenize(request.prompt!);
      const s = request.sampling!;
      const params = { temperature: s.temperature, topK: s.topK, topP: s.topP };
      const logits = await engine.prefill(prompt);
      const steps = async function* (): AsyncGenerator<GeneratedStep> {
        for await (const step of engine.generate(logits, request.generateTokens, params, { seed: s.seed, draws: 0 })) {
          yield step;
        }
      };
      const events: DecoderTelemetryEvent[] = [];
      await this.#stream(peer, request, steps(), events, pooled);
      await this.#done(peer, request.handoffId, true, null, events, null);
    } finally {
      this.pool.release(pooled);
    }
  }

  async #stream(
    peer: PeerConnection,
    request: GenerateRequest,
    steps: AsyncGenerator<GeneratedStep>,
    events: DecoderTelemetryEvent[],
    pooled: PooledEngine,
  ): Promise<void> {
    const pieces = new PieceDecoder(pooled.engine.model.vocab);
    let batch: TokenBatch = this.#emptyBatch(request.handoffId);
    let since = performance.now();
    for await (const step of steps) {
      events.push({ type: "token", atMs: performance.now() });
      batch.tokens.push(step.token);
      batch.text += pieces.push(step.token);
      if (request.probe && step.logits) batch.logitsSha256.push(sha256(step.logits));
      if (batch.tokens.length >= BATCH_TOKENS_MAX || performance.now() - since >= BATCH_WAIT_MS) {
        await peer.send(batch as unknown as Record<string, unknown>);
        batch = this.#emptyBatch(request.handoffId);
        since = performance.now();
      }
    }
    batch.text += pieces.flush();
    if (batch.tokens.length > 0 || batch.text) await peer.send(batch as unknown as Record<string, unknown>);
  }

  #emptyBatch(handoffId: string): TokenBatch {
    return { type: "TokenBatch", handoffId, tokens: [], text: "", logitsSha256: [] };
  }

  async #done(
    peer: PeerConnection,
    handoffId: string,
    ok: boolean,
    message: string | null,
    events: DecoderTelemetryEvent[],
    mtpReady: boolean | null,
  ): Promise<void> {
    const done: GenerateDone = { type: "GenerateDone", handoffId, ok, message, events, mtpReady };
    await peer.send(done as unknown as Record<string, unknown>).catch(() => {});
  }

  close(): void {
    for (const id of [...this.#committed.keys()]) this.#release(id);
  }
}

function sha256(values: Float32Array): string {
  return createHash("sha256").update(
    new Uint8Array(values.buffer, values.byteOffset, values.byteLength),
  ).digest("hex");
}


