/**
 * The decode side of one handoff attempt: the decoder transition table
 * (core/handoff_decoder.ts) driven by a prefill worker's messages, carrying out its actions:
 * reserve (identity, capacity, a fresh binding key), stage (tag, header, checksum, ledger,
 * then KV pages imported into an uncommitted context as they arrive), verify (manifest tag
 * and completeness), import (the end-of-prompt components, readiness checks), probe (decode
 * the first token; the table compares its logits digest with the prefiller's, which is in the
 * manifest or follows it as a ProbeDigest frame whose tag is checked here), and only then
 * CommitAck. Before commit the context refuses decode; on any failure it is wiped.
 */
import {
  type AbortReason,
  BoundedQueue,
  type ChunkHeader,
  createDecoder,
  type DecoderState,
  decoderStep,
  type FinalManifest,
  type HandoffAction,
  type HandoffEvent,
  type HandoffTiming,
  IdentityMismatchError,
  type ParityVerdict,
  type ReserveRequest,
  type StagingLedger,
  trunkLayerCount,
  validateManifest,
} from "../core/mod.ts";
import type { BindingContext } from "../core/binding.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import { StagedImport } from "../ffi/staged_import.ts";
import type { HandoffReceiver, PeerConnection } from "../transport/mod.ts";
import { StagedTail } from "./_decode_tail.ts";
import { committedSession, openStaging, stageChunk } from "./_decode_staging.ts";
import { readStreamEnd, streamFailure } from "./_decode_stream.ts";
import { FrameInbox } from "./_frame_inbox.ts";
import { checkReservation } from "./_reservation.ts";
import type { CommittedSession } from "./generation.ts";
import type { DecodeEngine } from "./engine.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import { probeStep } from "./probe.ts";

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
/** Frames read from the handoff stream and not yet staged: one staging, one arriving. */
const FRAMES_IN_HAND_MAX = 2;

export interface DecodeHandoffInput {
  request: ReserveRequest;
  /** The prefill worker's connection (its control stream carries our replies). */
  peer: PeerConnection;
  /** A context of its own, or a sequence of the shared one (the import lands in `engine.seq`). */
  engine: DecodeEngine;
  draft: MtpDraft | null;
  identity: ResolvedIdentity;
  /** This node's id: chunks bound to another destination fail their tag. */
  nodeId: string;
  timing: HandoffTiming;
  limits: DecodeLimits;
  /** Tests only (DecodeHooks.parity): replaces the reservation's parity verdict. */
  parityHook?: (verdict: ParityVerdict) => ParityVerdict;
}

export class DecodeHandoff {
  #state: DecoderState;
  readonly #events = new BoundedQueue<HandoffEvent>(EVENTS_MAX);
  readonly #telemetry: DecoderTelemetryEvent[] = [];
  readonly #inbox = new FrameInbox(FRAMES_IN_HAND_MAX);
  #ledger: StagingLedger | null = null;
  #staged: StagedImport | null = null;
  #binding: BindingContext | null = null;
  readonly #tail: StagedTail;
  readonly #trunkKinds: readonly string[];
  /** Whether bitwise parity with this worker's own colocated run can be claimed. */
  #parity: ParityVerdict | null = null;
  /** A probe digest read after a commit that did not compare digests (at most one). */
  #lateDigest = false;
  #receiver: HandoffReceiver | null = null;
  #nextLogits: Float32Array | null = null;
  #done: { committed: boolean; reason: AbortReason | null; message: string | null } | null = null;
  #failure: string | null = null;
  /** Set once the attempt has committed or been wiped. */
  #ended = false;

  constructor(readonly input: DecodeHandoffInput) {
    this.#state = createDecoder(input.timing);
    this.#trunkKinds = input.identity.numerical.layerKinds.filter((k) => k !== "mtp");
    this.#tail = new StagedTail(input.request.promptTokens);
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

  /** The coordinator or the prefiller gave up, or a newer attempt supersedes this one. */
  cancel(): void {
    this.#events.tryPush({ type: "Cancel" });
  }

  /** Bytes of state staged for this attempt and not yet committed; zero once it has ended. */
  get stagedBytes(): number {
    if (this.#ended) return 0;
    return (this.#ledger?.receivedBytes ?? 0) + this.#inbox.bytes;
  }

  /**
   * Reads this attempt's handoff stream: chunks, then the manifest, then (when the manifest
   * says it follows) the probe digest as the final frame.
   */
  attachStream(receiver: HandoffReceiver): void {
    this.#receiver = receiver;
    this.#readStream(receiver).catch((error) => this.#streamFailed(error));
  }

  async #readStream(receiver: HandoffReceiver): Promise<void> {
    for await (const frame of receiver) {
      const h = frame.header as Record<string, unknown>;
      if (this.#done !== null) {
        // Committed without comparing digests (parity not claimed): the prefiller's digest,
        // the stream's final frame, may still arrive. It is read, so the prefiller's send of
        // it completes and is not taken for a lost connection; nothing else is read after.
        if (this.#done.committed && h.type === "ProbeDigest" && !this.#lateDigest) {
          this.#lateDigest = true;
          continue;
        }
        return;
      }
      if (h.handoffId !== this.handoffId || h.attempt !== this.attempt) {
        // A frame of another handoff or attempt on this attempt's stream: replayed or spliced.
        return this.#reject("binding-tag", "State frame of another handoff or attempt");
      }
      if (h.type === "FinalManifest" || h.type === "ProbeDigest") {
        const push = (event: HandoffEvent) => this.#events.tryPush(event);
        const rejected = await readStreamEnd(frame, this.#binding, this.#telemetry, push);
        if (rejected) return this.#reject(rejected.reason, rejected.message);
        continue;
      }
      if (h.type !== "StateChunk") {
        return this.#reject("protocol-error", `Unexpected "${String(h.type).slice(0, 40)}" frame`);
      }
      const header = h.header as ChunkHeader;
      const seq = typeof header?.seq === "number" ? header.seq : -1;
      const held = this.#inbox.put(seq, {
        payload: frame.payload,
        tag: String(h.tag ?? ""),
        arrival: frame.arrival,
      });
      this.#events.tryPush({ ...h } as unknown as HandoffEvent);
      await held;
    }
  }

  /** The stream failed: a cut or lost connection, or a frame that breaks the framing. */
  #streamFailed(error: unknown): void {
    const rejected = streamFailure(error);
    if (rejected) this.#reject(rejected.reason, rejected.message);
    else this.#events.tryPush({ type: "ConnectionLost" });
  }

  #reject(reason: AbortReason, message: string): void {
    this.#failure = `Handoff stream rejected: ${message}`;
    this.#events.tryPush({ type: "ChunkRejected", reason });
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
      this.#inbox.release();
    }
    if (this.#done?.committed) {
      this.#ended = true;
      return this.#committed();
    }
    // Stop the prefiller's sends at once (it may be waiting for credit), then wipe.
    await this.#receiver?.abort(this.#done?.reason ?? "aborted").catch(() => {});
    try {
      await this.#wipe();
    } finally {
      this.#ended = true;
    }
    return null;
  }

  /** Why the attempt failed (one line, no content), after `run` resolved null. */
  get failure(): string | null {
    const reason = this.#done?.reason;
    return this.#failure ?? this.#done?.message ?? (reason ? `aborted (${reason})` : null);
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
        return this.#result(this.#verify(a.manifest));
      case "import":
        return this.#result(await this.#import());
      case "probe":
        return this.#result(await this.#probe());
      case "allow-generate":
        this.#done = { committed: true, reason: null, message: null };
        return;
      case "release":
        if (this.#done === null) {
          const reason = this.#state.outcome?.reason ?? null;
          // The table compares probe digests itself: name that failure here.
          const differ = reason === "probe-failed" && this.#failure === null;
          this.#failure ??= differ ? "continuation probe logits differ from the prefiller's" : null;
          this.#done = { committed: false, reason, message: this.#failure };
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

  #fail(
    type: "ReserveFailed" | "ChunkRejected" | "VerifyFailed" | "ImportFailed" | "ProbeFailed",
    reason: AbortReason,
    error: unknown,
  ): HandoffEvent {
    this.#failure = error instanceof Error ? error.message : String(error);
    return { type, reason };
  }

  async #reserve(request: ReserveRequest): Promise<HandoffEvent> {
    const own = this.input.identity;
    try {
      const nCtx = this.input.engine.contextTokens;
      const verdict = checkReservation(request, this.input.peer, {
        nodeId: this.input.nodeId,
        identity: own,
        nCtx,
      });
      this.#parity = this.input.parityHook?.(verdict) ?? verdict;
      this.#staged = await StagedImport.open(this.input.engine.ctx, {
        nTokens: request.promptTokens,
        seq: this.input.engine.seq,
        draft: this.input.draft?.ctx,
        stagedBytesMax: this.input.limits.stagingBytesMax,
      });
    } catch (error) {
      const reason = error instanceof IdentityMismatchError
        ? "identity-mismatch"
        : "reserve-rejected";
      return this.#fail("ReserveFailed", reason, error);
    }
    const opened = openStaging(request, this.input, this.input.limits.stagingBytesMax);
    const { bindingKey } = opened;
    this.#binding = opened.binding;
    this.#ledger = opened.ledger;
    return {
      type: "Reserved",
      creditBytes: this.input.limits.stagingBytesMax,
      bindingKey,
      // Probe digests are compared only where bitwise parity is claimed (core/handoff_decoder.ts).
      parity: this.#parity.parity,
    };
  }

  async #stage(raw: ChunkHeader): Promise<HandoffEvent> {
    const frame = this.#inbox.take(raw?.seq);
    const staging = {
      binding: this.#binding!,
      ledger: this.#ledger!,
      staged: this.#staged!,
      tail: this.#tail,
      trunkKinds: this.#trunkKinds,
      telemetry: this.#telemetry,
    };
    const fail = (reason: AbortReason, error: unknown) =>
      this.#fail("ChunkRejected", reason, error);
    try {
      return await stageChunk(staging, raw, frame, fail);
    } finally {
      this.#inbox.done();
    }
  }

  #verify(raw: FinalManifest): HandoffEvent {
    try {
      const trunkLayers = trunkLayerCount(this.input.identity.numerical);
      const manifest = validateManifest(raw, { trunkLayers });
      // The tag was checked over the frame's bytes (readStreamEnd); it binds this handoff's key.
      if (manifest.handoffId !== this.#binding!.handoffId) {
        return this.#fail("VerifyFailed", "binding-tag", "manifest names another handoff");
      }
      const verdict = this.#ledger!.verifyAgainst(manifest);
      if (!verdict.ok) throw verdict.error;
      return { type: "Verified" };
    } catch (error) {
      return this.#fail("VerifyFailed", "invalid-state", error);
    }
  }

  async #import(): Promise<HandoffEvent> {
    const staged = this.#staged!;
    const t0 = performance.now();
    try {
      await this.#tail.importInto(staged);
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
   * The continuation probe: make the imported state live, decode the first token and hand the
   * logits digest to the table, which compares it with the prefiller's. Generation stays
   * forbidden until CommitAck.
   */
  async #probe(): Promise<HandoffEvent> {
    try {
      const committed = await this.#staged!.commit();
      this.input.draft?.resetPending();
      if (committed.mtpHidden && this.input.draft) {
        this.input.draft.adoptPending(committed.mtpHidden);
      }
      this.input.engine.adoptPosition(this.input.request.promptTokens);
      const t0 = performance.now();
      const { logits, digest } = await probeStep(this.input.engine, this.#tail.firstToken!);
      const atMs = performance.now();
      this.#telemetry.push({ type: "probe", atMs, durationMs: atMs - t0 });
      this.#nextLogits = logits;
      return { type: "ProbeDone", logitsSha256: digest };
    } catch (error) {
      return this.#fail("ProbeFailed", "probe-failed", error);
    }
  }

  #committed(): CommittedSession {
    return committedSession(this.input, {
      parity: this.#parity,
      tail: this.#tail,
      nextLogits: this.#nextLogits!,
      telemetry: this.#telemetry,
    });
  }

  /** Wipes whatever was staged or imported, zeroing held payloads. */
  async #wipe(): Promise<void> {
    this.#inbox.wipe();
    this.#tail.wipe();
    await this.#staged?.abort().catch(() => {});
    await this.input.engine.wipe();
    this.input.draft?.ctx.clearMemory();
  }
}
