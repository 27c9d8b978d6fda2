/**
 * The decode side of one handoff attempt: the decoder transition table
 * (core/handoff_decoder.ts) driven by a prefill worker's messages, carrying out its actions:
 * reserve (identity, capacity, a fresh binding key), stage (tag, header, checksum, ledger,
 * then KV pages imported into an uncommitted context as they arrive), verify (manifest tag
 * and completeness), import (the end-of-prompt components, readiness checks), probe (decode
 * the first token and compare the logits digest with the prefiller's), and only then
 * CommitAck. Before commit the context refuses decode; on any failure it is wiped.
 */
import {
  type AbortReason,
  BoundedQueue,
  type ChunkHeader,
  compareIdentity,
  createDecoder,
  decodePositions,
  decodeSampler,
  decodeTokens,
  type DecoderState,
  decoderStep,
  type FinalManifest,
  formatIdentityMismatches,
  type HandoffAction,
  type HandoffEvent,
  type HandoffTiming,
  IdentityMismatchError,
  LimitExceededError,
  newBindingKey,
  type NumericalIdentity,
  payloadChecksum,
  type ReserveRequest,
  type SamplerPayload,
  StagingLedger,
  StateValidationError,
  trunkLayerCount,
  validateChunkHeader,
  validateManifest,
  verifyChunkPayload,
  verifyChunkTag,
  verifyManifestTag,
} from "../core/mod.ts";
import type { BindingContext } from "../core/binding.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import { StagedImport } from "../ffi/staged_import.ts";
import type { HandoffReceiver, PeerConnection } from "../transport/mod.ts";
import type { Engine } from "./engine.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { MtpDraft } from "./mtp.ts";

/** Bounds of the decode side, each named with its unit. */
export interface DecodeLimits {
  /** Bytes of state the decoder agrees to hold staged at once (the initial credit). */
  stagingBytesMax: number;
  tickMs: number;
}

export const DEFAULT_DECODE_LIMITS: Readonly<DecodeLimits> = {
  stagingBytesMax: 1024 * 1024 * 1024,
  tickMs: 50,
};

const EVENTS_MAX = 4096;

/** A committed session, ready to generate: everything the decode loop continues from. */
export interface CommittedSession {
  handoffId: string;
  tenantId: string;
  engine: Engine;
  draft: MtpDraft | null;
  history: Int32Array;
  firstToken: number;
  /** Logits after decoding the first token (from the probe): the second token samples these. */
  nextLogits: Float32Array;
  sampler: SamplerPayload;
  events: DecoderTelemetryEvent[];
  mtpReady: boolean | null;
}

interface Tail {
  conv?: Uint8Array;
  ssm?: Uint8Array;
  swa?: Uint8Array;
  mtpHidden?: Uint8Array;
  positions?: number;
  sampler?: SamplerPayload;
  history?: Int32Array;
  firstToken?: number;
}

export interface DecodeHandoffInput {
  request: ReserveRequest;
  /** The prefill worker's connection (its control stream carries our replies). */
  peer: PeerConnection;
  engine: Engine;
  draft: MtpDraft | null;
  identity: ResolvedIdentity;
  /** This node's id: chunks bound to another destination fail their tag. */
  nodeId: string;
  timing: HandoffTiming;
  limits: DecodeLimits;
}

export class DecodeHandoff {
  #state: DecoderState;
  readonly #events = new BoundedQueue<HandoffEvent>(EVENTS_MAX);
  readonly #telemetry: DecoderTelemetryEvent[] = [];
  readonly #frames = new Map<number, { payload: Uint8Array; tag: string }>();
  #ledger: StagingLedger | null = null;
  #staged: StagedImport | null = null;
  #binding: BindingContext | null = null;
  #tail: Tail = {};
  #manifest: FinalManifest | null = null;
  #nextLogits: Float32Array | null = null;
  #done: { committed: boolean; reason: AbortReason | null; message: string | null } | null =
    null;
  #failure: string | null = null;
  #frameConsumed: (() => void) | null = null;

  constructor(readonly input: DecodeHandoffInput) {
    this.#state = createDecoder(input.timing);
  }

  get handoffId(): string {
    return this.input.request.handoffId;
  }

  get attempt(): number {
    return this.input.request.attempt;
  }

  /** Delivers a control message for this handoff (AbortNotice). */
  deliver(header: Record<string, unknown>): void {
    this.#events.tryPush(header as unknown as HandoffEvent);
  }

  /** The prefiller's connection ended. */
  connectionLost(): void {
    this.#events.tryPush({ type: "ConnectionLost" });
  }

  /** Reads this attempt's handoff stream: chunks, then the manifest as the final frame. */
  attachStream(receiver: HandoffReceiver): void {
    (async () => {
      try {
        for await (const frame of receiver) {
          const h = frame.header as Record<string, unknown>;
          if (h.type === "StateChunk") {
            const header = h.header as ChunkHeader;
            const seq = typeof header?.seq === "number" ? header.seq : -1;
            if (this.#frames.has(seq)) {
              // The same sequence number twice on one stream: a duplicated or replayed chunk.
              this.#events.tryPush({ ...h } as unknown as HandoffEvent);
              continue;
            }
            // One frame in hand at a time: the next is read only after this one was staged,
            // so a fast sender is held back by transport credit, not by our memory.
            const consumed = new Promise<void>((resolve) => this.#frameConsumed = resolve);
            this.#frames.set(seq, { payload: frame.payload.slice(), tag: String(h.tag ?? "") });
            this.#events.tryPush({ ...h } as unknown as HandoffEvent);
            await consumed;
            if (this.#done !== null) break;
          } else if (h.type === "FinalManifest") {
            this.#telemetry.push({ type: "manifest-received", atMs: performance.now() });
            this.#events.tryPush({ ...h } as unknown as HandoffEvent);
          }
        }
      } catch {
        this.#events.tryPush({ type: "ConnectionLost" });
      }
    })();
  }

  /**
   * Runs the attempt: resolves with the committed session, or null after a failure (the
   * context is wiped and the reason was sent to the prefiller).
   */
  async run(): Promise<CommittedSession | null> {
    const ticker = setInterval(
      () => this.#events.tryPush({ type: "Tick", elapsedMs: this.input.limits.tickMs }),
      this.input.limits.tickMs,
    );
    try {
      await this.#feed(this.input.request);
      while (this.#done === null) {
        const event = await this.#events.shift();
        if (event === undefined) break;
        await this.#feed(event);
      }
    } finally {
      clearInterval(ticker);
      this.#frameConsumed?.();
    }
    if (this.#done?.committed) return this.#committed();
    await this.#wipe();
    return null;
  }

  /** Why the attempt failed (one line, no content), after `run` resolved null. */
  get failure(): string | null {
    return this.#failure ?? this.#done?.message ?? null;
  }

  async #feed(event: HandoffEvent): Promise<void> {
    const r = decoderStep(this.#state, event);
    this.#state = r.state;
    for (const action of r.actions) await this.#perform(action);
  }

  async #perform(a: HandoffAction): Promise<void> {
    switch (a.type) {
      case "send":
        return await this.#send(a.msg as unknown as Record<string, unknown>);
      case "reserve":
        return this.#result(await this.#reserve(a.request));
      case "stage":
        return this.#result(await this.#stage(a.header));
      case "verify":
        return this.#result(await this.#verify(a.manifest));
      case "import":
        return this.#result(await this.#import());
      case "probe":
        return this.#result(await this.#probe());
      case "allow-generate":
        this.#done = { committed: true, reason: null, message: null };
        return;
      case "release":
        if (this.#done === null) {
          this.#done = { committed: false, reason: null, message: this.#failure };
        }
        return;
      default:
        return;
    }
  }

  #result(event: HandoffEvent): void {
    this.#events.tryPush(event);
  }

  async #send(msg: Record<string, unknown>): Promise<void> {
    try {
      await this.input.peer.send(msg);
    } catch {
      this.#events.tryPush({ type: "ConnectionLost" });
    }
  }

  #fail(type: "ReserveFailed" | "ChunkRejected" | "VerifyFailed" | "ImportFailed" | "ProbeFailed",
    reason: AbortReason, error: unknown): HandoffEvent {
    this.#failure = error instanceof Error ? error.message : String(error);
    return { type, reason };
  }

  async #reserve(request: ReserveRequest): Promise<HandoffEvent> {
    const own = this.input.identity;
    try {
      if (request.identityDigest !== own.digest) {
        throw new IdentityMismatchError(this.#mismatchMessage());
      }
      if (request.destNodeId !== this.input.nodeId) {
        throw new StateValidationError("Reservation is addressed to another decode worker");
      }
      if (request.contextTokensNeeded > this.input.engine.ctx.nCtx) {
        throw new LimitExceededError(
          `Request needs ${request.contextTokensNeeded} context tokens, this decoder has ${this.input.engine.ctx.nCtx}`,
        );
      }
      this.#staged = await StagedImport.open(this.input.engine.ctx, {
        nTokens: request.promptTokens,
        draft: this.input.draft?.ctx,
        stagedBytesMax: this.input.limits.stagingBytesMax,
      });
    } catch (error) {
      const reason = error instanceof IdentityMismatchError ? "identity-mismatch" : "reserve-rejected";
      return this.#fail("ReserveFailed", reason, error);
    }
    const bindingKey = newBindingKey();
    this.#binding = {
      bindingKey,
      handoffId: request.handoffId,
      destNodeId: this.input.nodeId,
      tenantId: request.tenantId,
    };
    this.#ledger = new StagingLedger({
      handoffId: request.handoffId,
      identityDigest: own.digest,
      family: own.numerical.family,
      trunkLayers: trunkLayerCount(own.numerical),
      creditBytes: this.input.limits.stagingBytesMax,
    });
    return { type: "Reserved", creditBytes: this.input.limits.stagingBytesMax, bindingKey };
  }

  #mismatchMessage(): string {
    const remote = this.input.peer.peerCapabilities?.numericalIdentity;
    if (remote && typeof remote === "object") {
      const mismatches = compareIdentity(
        this.input.identity.numerical,
        remote as unknown as NumericalIdentity,
      );
      if (mismatches.length > 0) {
        return `Numerical identity differs: ${formatIdentityMismatches(mismatches)}`;
      }
    }
    return "Numerical identity digest differs from this decode worker's";
  }

  async #stage(raw: ChunkHeader): Promise<HandoffEvent> {
    const frame = this.#frames.get(raw?.seq);
    this.#frames.delete(raw?.seq);
    try {
      return await this.#stageFrame(raw, frame);
    } finally {
      this.#frameConsumed?.();
      this.#frameConsumed = null;
    }
  }

  async #stageFrame(
    raw: ChunkHeader,
    frame: { payload: Uint8Array; tag: string } | undefined,
  ): Promise<HandoffEvent> {
    try {
      if (!frame) throw new StateValidationError("State chunk without its payload");
      const header = validateChunkHeader(raw);
      if (!await verifyChunkTag(this.#binding!, header, frame.tag)) {
        return this.#fail("ChunkRejected", "binding-tag", "chunk binding tag does not verify");
      }
      await verifyChunkPayload(header, frame.payload);
      this.#ledger!.accept(header);
      const t0 = performance.now();
      await this.#stageComponent(header, frame.payload);
      this.#telemetry.push({
        type: "import",
        atMs: performance.now(),
        kind: header.kind,
        bytes: header.payloadBytes,
        durationMs: performance.now() - t0,
      });
      const credit = header.kind === "kv-page" ? header.payloadBytes : 0;
      this.#ledger!.grantCredit(credit);
      return { type: "ChunkStaged", creditBytes: credit };
    } catch (error) {
      const reason = error instanceof LimitExceededError ? "credit-exceeded" : "invalid-state";
      return this.#fail("ChunkRejected", reason, error);
    }
  }

  async #stageComponent(h: ChunkHeader, payload: Uint8Array): Promise<void> {
    const staged = this.#staged!;
    const n = this.input.request.promptTokens;
    switch (h.kind) {
      case "kv-page":
        return await staged.addPage(payload);
      case "mtp-kv":
        return await staged.addMtpPage(payload);
      case "conv":
        this.#tail.conv = payload;
        return;
      case "ssm":
        this.#tail.ssm = payload;
        return;
      case "swa-kv":
        this.#tail.swa = payload;
        return;
      case "mtp-hidden":
        this.#tail.mtpHidden = payload;
        return;
      case "positions": {
        const p = decodePositions(payload);
        if (p.nPast !== n) throw new StateValidationError(`positions: n_past is not ${n}`);
        this.#tail.positions = p.nPast;
        return;
      }
      case "sampler":
        this.#tail.sampler = decodeSampler(payload);
        return;
      case "history":
        this.#tail.history = decodeTokens(payload, "history");
        if (this.#tail.history.length !== n) {
          throw new StateValidationError(`history: ${this.#tail.history.length} tokens, expected ${n}`);
        }
        return;
      case "first-token":
        this.#tail.firstToken = decodeTokens(payload, "first-token")[0];
        return;
    }
  }

  async #verify(raw: FinalManifest): Promise<HandoffEvent> {
    try {
      const trunkLayers = trunkLayerCount(this.input.identity.numerical);
      const manifest = validateManifest(raw, { trunkLayers });
      if (!await verifyManifestTag(manifest, this.#binding!)) {
        return this.#fail("VerifyFailed", "binding-tag", "manifest binding tag does not verify");
      }
      const verdict = this.#ledger!.verifyAgainst(manifest);
      if (!verdict.ok) throw verdict.error;
      this.#manifest = manifest;
      return { type: "Verified" };
    } catch (error) {
      return this.#fail("VerifyFailed", "invalid-state", error);
    }
  }

  async #import(): Promise<HandoffEvent> {
    const staged = this.#staged!;
    const t0 = performance.now();
    try {
      const tail = this.#tail;
      if (tail.conv && tail.ssm) await staged.setRecurrent({ layout: "split", conv: tail.conv, ssm: tail.ssm });
      if (tail.swa) await staged.setSwa(tail.swa);
      if (tail.mtpHidden) staged.setMtpHidden(tail.mtpHidden);
      const missing = ["positions", "sampler", "history", "firstToken"].find((k) =>
        tail[k as keyof Tail] === undefined
      );
      if (missing) throw new StateValidationError(`Cannot commit: ${missing} missing`);
      await staged.validate();
      this.#telemetry.push({
        type: "import",
        atMs: performance.now(),
        kind: "conv",
        bytes: 0,
        durationMs: performance.now() - t0,
      });
      return { type: "Imported" };
    } catch (error) {
      return this.#fail("ImportFailed", "import-failed", error);
    }
  }

  /**
   * The continuation probe: make the imported state live, decode the first token and compare
   * the logits digest with the prefiller's. Generation stays forbidden until CommitAck.
   */
  async #probe(): Promise<HandoffEvent> {
    try {
      const committed = await this.#staged!.commit();
      if (committed.mtpHidden && this.input.draft) this.input.draft.adoptPending(committed.mtpHidden);
      const engine = this.input.engine;
      engine.adoptPosition(this.input.request.promptTokens);
      const logits = await engine.step(this.#tail.firstToken!);
      const want = this.#manifest?.probe?.logitsSha256;
      if (want !== undefined) {
        const got = await payloadChecksum(new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength));
        if (got !== want) {
          return this.#fail("ProbeFailed", "probe-failed", "continuation probe logits differ");
        }
      }
      this.#nextLogits = logits;
      return { type: "ProbePassed" };
    } catch (error) {
      return this.#fail("ProbeFailed", "probe-failed", error);
    }
  }

  #committed(): CommittedSession {
    const now = performance.now();
    const mtp = this.input.draft !== null;
    this.#telemetry.push({ type: "committed", atMs: now });
    this.#telemetry.push({ type: "ready", atMs: now, target: true, mtp: mtp ? true : null });
    return {
      handoffId: this.handoffId,
      tenantId: this.input.request.tenantId,
      engine: this.input.engine,
      draft: this.input.draft,
      history: this.#tail.history!,
      firstToken: this.#tail.firstToken!,
      nextLogits: this.#nextLogits!,
      sampler: this.#tail.sampler!,
      events: this.#telemetry,
      mtpReady: mtp ? true : null,
    };
  }

  /** Wipes whatever was staged or imported, zeroing held payloads. */
  async #wipe(): Promise<void> {
    for (const f of this.#frames.values()) f.payload.fill(0);
    this.#frames.clear();
    for (const v of [this.#tail.conv, this.#tail.ssm, this.#tail.swa, this.#tail.mtpHidden]) {
      v?.fill(0);
    }
    this.#tail = {};
    await this.#staged?.abort().catch(() => {});
    this.input.engine.ctx.clearMemory();
    this.input.draft?.ctx.clearMemory();
    this.input.engine.adoptPosition(0);
  }
}
