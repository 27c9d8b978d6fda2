/**
 * The prefill side of one handoff: runs the exporter (chunked prefill, a page per chunk) and
 * the prefiller transition table (core/handoff_prefiller.ts) against a decode worker, and
 * carries out the table's actions: reservation and aborts on the control stream, chunks and
 * the final manifest on a dedicated handoff stream, retries under fresh reservations, and the
 * erasure of retained state.
 *
 * What a retry needs is retained here until CommitAck, lease expiry or failure: every chunk
 * header, and the payloads of the end-of-prompt components. KV page payloads are dropped
 * (zeroed) once sent, and exported again from the context if a retry needs them.
 */
import {
  type AbortReason,
  BoundedQueue,
  computeChunkTag,
  contextTokensNeeded,
  createPrefiller,
  type FinalManifestMessage,
  HandoffAbortedError,
  type HandoffAction,
  type HandoffEvent,
  type HandoffTiming,
  LimitExceededError,
  prefillerCanExport,
  type PrefillerState,
  prefillerStep,
  type SamplerState,
  StateValidationError,
} from "../core/mod.ts";
import type { BindingContext } from "../core/binding.ts";
import { PrefillerTelemetry } from "../core/telemetry.ts";
import type { HandoffSender } from "../transport/mod.ts";
import type { DecoderChannel } from "./decoder_channel.ts";
import type { Engine } from "./engine.ts";
import {
  DEFAULT_EXPORT_LIMITS,
  type ExportPrefix,
  type ExportResult,
  type FirstTokenHook,
  reexportPage,
} from "./exporter.ts";
import { RetainedState } from "./_retained_state.ts";
import { runExport } from "./_export_run.ts";
import { StreamEnd } from "./_stream_end.ts";
import { within } from "./_deadline.ts";
import type { ResolvedIdentity } from "./identity.ts";
import { describeAbort, type PrefillOutcome, type PrefillRequest } from "./messages.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import { CORE_MESSAGE_TYPES } from "./wire.ts";
import { faultPoint } from "./fault_points.ts";
import { DECODER_LOST, type PrefillCompletion } from "./prefill_completion.ts";

/** Bounds of one prefill-side handoff, each named with its unit. */
export interface PrefillLimits {
  /** Exported chunks waiting to be sent; prefill pauses when this is reached. */
  exportQueueBytesMax: number;
  /** End-of-prompt components retained for a retry until CommitAck. */
  retainedBytesMax: number;
  /** How often the table's timers are advanced. */
  tickMs: number;
  /** Send recurrent layers while the last chunk computes (see ExportLimits.layerCapture). */
  layerCapture: boolean;
  /** With it, a hybrid model's last page too (see ExportLimits.lastPageCapture). */
  lastPageCapture: boolean;
  /** Largest state chunk payload, in bytes (see ExportLimits.chunkBytesMax). */
  chunkBytesMax: number;
}

export const DEFAULT_PREFILL_LIMITS: Readonly<PrefillLimits> = {
  exportQueueBytesMax: 256 * 1024 * 1024,
  retainedBytesMax: 1024 * 1024 * 1024,
  tickMs: 50,
  layerCapture: true,
  lastPageCapture: true,
  chunkBytesMax: DEFAULT_EXPORT_LIMITS.chunkBytesMax,
};

/** Pending events are few by construction (one chunk held, control messages bounded). */
const EVENTS_MAX = 4096;

export interface PrefillHandoffInput {
  request: PrefillRequest;
  prompt: Int32Array;
  engine: Engine;
  draft: MtpDraft | null;
  identity: ResolvedIdentity;
  /**
   * This handoff's channel on the link to the decode worker; called again for a retry after
   * a connection loss, with the channel that failed (its link is not trusted again).
   */
  connectDecoder: (failed: DecoderChannel | null) => Promise<DecoderChannel>;
  sourceNodeId: string;
  timing: HandoffTiming;
  limits: PrefillLimits;
  cancel: AbortSignal;
  /** Called once the first token is sampled, before the tail is exported (see FirstTokenHook). */
  onFirstToken?: FirstTokenHook;
  /** Tokens restored from the prefix cache and checkpoints to take (serve/prefix_cache.ts). */
  prefix?: ExportPrefix;
  /** Tests only (PrefillHooks.probeDigest): replaces the probe digest sent. */
  probeDigestHook?: (logitsSha256: string) => string;
}

export class PrefillHandoff {
  #state: PrefillerState;
  readonly #events = new BoundedQueue<HandoffEvent>(EVENTS_MAX);
  readonly #telemetry = new PrefillerTelemetry();
  readonly #retained: RetainedState;
  /** The attempt each ConnectionLost event was raised in: older ones are stale. */
  readonly #lostIn = new WeakMap<HandoffEvent, number>();
  #feedIndex = 0;
  #exportError: unknown = null;
  /** The manifest and the probe digest that end this attempt's stream. */
  readonly #end = new StreamEnd();
  /** When this attempt's ReserveRequest left (null: answered, or none sent). */
  #reserveSentAt: number | null = null;
  #decoder: DecoderChannel | null = null;
  #stream: HandoffSender | null = null;
  #binding: BindingContext | null = null;
  #outcome: PrefillOutcome | null = null;
  #stagedAcks = 0;
  /** Why a local step failed (one line, no content), for the outcome's message. */
  #localFailure: string | null = null;
  #exportResult: { result: ExportResult; sampler: SamplerState } | null = null;
  #completion: PrefillCompletion | null = null;

  constructor(readonly input: PrefillHandoffInput) {
    this.#retained = new RetainedState(input.limits);
    const r = input.request;
    const n = input.prompt.length;
    this.#state = createPrefiller({
      handoffId: r.handoffId,
      tenantId: r.tenantId,
      sourceNodeId: input.sourceNodeId,
      destNodeId: r.decode.nodeId,
      identityDigest: input.identity.digest,
      family: input.identity.numerical.family,
      promptTokens: n,
      stateBytesEstimate: 0,
      contextTokensNeeded: contextTokensNeeded({
        promptTokens: n,
        generateTokensMax: r.generateTokens + 1,
        draftTokensMax: 0,
      }),
    }, input.timing);
  }

  /** Runs the handoff to its end; never throws for handoff failures (see the outcome). */
  async run(): Promise<PrefillOutcome> {
    const t = () => performance.now();
    this.#telemetry.push({ type: "request-start", atMs: t() });
    const ticker = setInterval(
      () => this.#events.tryPush({ type: "Tick", elapsedMs: this.input.limits.tickMs }),
      this.input.limits.tickMs,
    );
    const onCancel = () => this.#events.tryPush({ type: "Cancel" });
    this.input.cancel.addEventListener("abort", onCancel, { once: true });
    if (this.input.cancel.aborted) onCancel(); // cancelled while a context or connection was awaited
    const exporting = this.#runExporter();
    try {
      if (await this.#connect()) await this.#loop();
    } finally {
      clearInterval(ticker);
      this.input.cancel.removeEventListener("abort", onCancel);
      // The handoff is over on the link: its stream ends and it leaves the link, which stays
      // open for other handoffs (a connection per handoff used to end both by closing).
      const stream = this.#stream;
      this.#stream = null;
      stream?.abort("handoff ended").catch(() => {});
      const decoder = this.#decoder;
      this.#decoder = null;
      decoder?.close();
      const completing = this.#decoderLost();
      if (completing) {
        // Finish the prompt (nothing retained) so this worker can complete the request; a
        // cancel still stops it.
        this.#retained.drain();
        const stop = () => this.#retained.stop();
        this.input.cancel.addEventListener("abort", stop, { once: true });
        await exporting;
        this.input.cancel.removeEventListener("abort", stop);
      } else {
        this.#retained.stop();
        await exporting;
      }
    }
    return this.#finish();
  }

  /**
   * The decode worker was lost before the commit, the coordinator asked this worker to
   * complete the request then, and nothing else went wrong: the prompt's state is all here.
   */
  #decoderLost(): boolean {
    const o = this.#outcome;
    return this.input.request.completeOnDecoderLoss === true && o !== null &&
      o.outcome !== "committed" && o.reason !== null && DECODER_LOST.has(o.reason) &&
      !this.input.cancel.aborted && this.#exportError === null && this.#localFailure === null;
  }

  /**
   * Set once the handoff ended without a commit because the decode worker was lost and the
   * whole prompt was prefilled here: what generation continues from (the context holds the
   * prompt and the first token). Null otherwise.
   */
  get completion(): PrefillCompletion | null {
    return this.#completion;
  }

  async #loop(): Promise<void> {
    await this.#feed({ type: "Start" });
    while (this.#outcome === null) {
      await this.#pumpExport();
      if (this.#outcome !== null) return;
      // Every waiting event before the next chunk: a cancel must not queue behind timers.
      do {
        const event = await this.#events.shift();
        if (event === undefined) return;
        if (!this.#isStale(event)) await this.#feed(event);
      } while (this.#events.size > 0 && this.#outcome === null);
    }
  }

  /** Bytes of exported state this handoff holds now (zero once it has ended). */
  get retainedBytes(): number {
    return this.#retained.heldBytes;
  }

  /** A connection loss seen by an earlier attempt: the retry already dealt with it. */
  #isStale(event: HandoffEvent): boolean {
    return event.type === "ConnectionLost" && this.#lostIn.get(event) !== this.#state.attempt;
  }

  #connectionLost(): void {
    const event: HandoffEvent = { type: "ConnectionLost" };
    this.#lostIn.set(event, this.#state.attempt);
    this.#events.tryPush(event);
  }

  #finish(): PrefillOutcome {
    this.#retained.erase();
    const o = this.#outcome ?? this.#result("failed", "protocol-error", "handoff ended early");
    const done = this.#exportResult;
    if (done && this.#decoderLost() && !this.input.cancel.aborted) {
      const { seed } = this.input.request.sampling;
      this.#completion = {
        firstToken: done.result.firstToken,
        nextLogits: done.result.probeLogits,
        sampler: { ...done.sampler, seed },
      };
      const why = o.message ?? describeAbort(o.reason!);
      return {
        ...o,
        outcome: "fallback",
        message: `decoder lost before commit (${why}); completed on the prefill worker`,
        completedHere: true,
        telemetry: this.#telemetry.summary(),
      };
    }
    return { ...o, telemetry: this.#telemetry.summary() };
  }

  async #connect(): Promise<boolean> {
    const previous = this.#decoder;
    this.#decoder = null;
    previous?.close();
    try {
      // A retry gets as long to reach the decoder as a reservation gets to be answered (a
      // QUIC connect to a dead host would otherwise take its own 3 s).
      const connecting = this.input.connectDecoder(previous);
      const ms = this.input.timing.reserveTimeoutMs;
      const decoder = previous === null ? await connecting : await within(connecting, ms, () => {
        connecting.then((late) => late.close(), () => {});
        return new LimitExceededError(`No connection within reserveTimeoutMs (${ms} ms)`);
      });
      this.#decoder = decoder;
      this.#listen(decoder);
      return true;
    } catch (error) {
      const again = previous ? "Cannot reconnect to the decode worker for a retry: " : "";
      this.#outcome = this.#result("failed", "connection-lost", again + (error as Error).message);
      return false;
    }
  }

  /** Moves the decoder's control messages for this handoff, and its loss, into events. */
  #listen(decoder: DecoderChannel): void {
    const id = this.input.request.handoffId;
    (async () => {
      try {
        for (;;) {
          const h = await decoder.receive();
          if (h.handoffId !== id || !CORE_MESSAGE_TYPES.has(h.type as string)) continue;
          if (h.type === "TransferCredit") this.#noteStaged();
          if (!this.#events.tryPush(h as unknown as HandoffEvent)) break;
        }
      } catch {
        // The link failed (or this channel was closed): reported below as ConnectionLost.
      }
      if (this.#decoder === decoder) this.#connectionLost();
    })();
  }

  #noteStaged(): void {
    // The decoder grants credit back once per page (kv-page or mtp-kv) it has imported, in
    // stream order, so the k-th grant proves page k arrived and was staged (on this clock).
    const page =
      this.#retained.headers().filter((h) =>
        h.kind === "kv-page" || h.kind === "mtp-kv"
      )[this.#stagedAcks++];
    if (page) {
      this.#telemetry.push({
        type: "chunk-staged",
        atMs: performance.now(),
        seq: page.seq,
        bytes: page.payloadBytes,
      });
    }
  }

  async #feed(event: HandoffEvent): Promise<void> {
    // An event's actions are timed by when it arrived: on CommitAck the retained state is
    // zeroed first (172 MB on lab-state, 12-100 ms here), which is not part of the handoff.
    const now = performance.now();
    const r = prefillerStep(this.#state, event);
    this.#state = r.state;
    for (const action of r.actions) await this.#perform(action, now);
  }

  async #perform(a: HandoffAction, now: number): Promise<void> {
    switch (a.type) {
      case "send":
        return await this.#send(a.msg);
      case "bind":
        // The reservation was accepted: its round trip is this attempt's RTT to the decoder.
        if (this.#reserveSentAt !== null) {
          this.#telemetry.push({
            type: "reserved",
            atMs: now,
            roundTripMs: now - this.#reserveSentAt,
          });
          this.#reserveSentAt = null;
        }
        return await this.#bind(a.bindingKey);
      case "retry":
        this.#telemetry.push({ type: "retry", atMs: now, reason: a.reason });
        return await this.#restart(a.reason);
      case "erase-retained":
        return this.#retained.erase();
      case "release":
        await this.#stream?.abort("released").catch(() => {});
        this.#stream = null;
        return;
      case "committed":
        this.#telemetry.push({ type: "commit-ack", atMs: now });
        this.#outcome = this.#result("committed", null, null);
        return;
      case "fallback":
        this.#telemetry.push({ type: "fallback", atMs: now, reason: a.reason });
        this.#outcome = this.#result("fallback", a.reason, this.#why(a.reason));
        return;
      case "fail":
        this.#outcome = this.#result("failed", a.reason, this.#why(a.reason));
        return;
    }
  }

  #why(reason: AbortReason): string {
    return this.#localFailure ?? describeAbort(reason);
  }

  async #send(msg: HandoffEvent & { type: string }): Promise<void> {
    try {
      if (msg.type === "StateChunk") return await this.#sendChunk(msg.header.seq);
      if (msg.type === "FinalManifest") {
        // The component list grows with the prompt: it travels as the frame's payload (bounded
        // by the frame's payload limit), never in the header. The probe digest follows it on
        // the same stream, as its final frame. The payload is the bytes its tag covers, as
        // signed: the decoder checks the tag before it parses them.
        const { manifest, ...head } = msg as FinalManifestMessage;
        await this.#stream!.send({ ...head, tag: manifest.tag }, this.#end.payload(manifest));
        this.#telemetry.push({ type: "manifest-sent", atMs: performance.now() });
        this.#end.manifestLeft();
        return;
      }
      if (msg.type === "ProbeDigest") {
        await this.#stream!.finish({ ...msg });
        this.#telemetry.push({ type: "probe-digest-sent", atMs: performance.now() });
        return;
      }
      if (!this.#decoder) throw new Error("no connection to the decode worker");
      if (msg.type === "ReserveRequest") this.#reserveSentAt = performance.now();
      await this.#decoder.send({ ...msg } as unknown as Record<string, unknown>);
    } catch (error) {
      if (error instanceof LimitExceededError || error instanceof StateValidationError) {
        // A local bound or check (a frame too big for the decoder's credit window, a page
        // that cannot be exported again): no retry can help.
        this.#localFailure = (error as Error).message;
        this.#events.tryPush({ type: "ExportFailed" });
        return;
      }
      // The decoder failed the attempt and dropped its stream: its AbortNotice, sent first on
      // the control stream, says why (a lost connection is reported by #listen).
      if (error instanceof HandoffAbortedError && error.reason === "receiver-aborted") return;
      this.#connectionLost(); // the stream or the connection is gone
    }
  }

  async #sendChunk(seq: number): Promise<void> {
    const header = this.#retained.header(seq);
    const payload = this.#retained.payload(seq) ??
      await reexportPage(this.input.engine.ctx, header);
    const tag = await computeChunkTag(this.#binding!, header);
    const t0 = performance.now();
    // The chunk's own checksum covers the payload (the decoder verifies it), so the frame's
    // CRC leaves it out: every byte of state is read once per side, not twice.
    await this.#stream!.send(
      {
        type: "StateChunk",
        handoffId: header.handoffId,
        attempt: this.#state.attempt,
        header,
        tag,
      } as unknown as Record<string, unknown>,
      payload,
      { payloadChecked: false },
    );
    const atMs = performance.now();
    this.#telemetry.push({
      type: "chunk-sent",
      atMs,
      seq,
      kind: header.kind,
      bytes: header.payloadBytes,
      durationMs: atMs - t0,
    });
    // Sent: the context still holds a KV page's cells; a retry exports them again.
    this.#retained.markSent(seq);
    faultPoint("prefill-chunk-sent");
  }

  async #bind(bindingKey: Uint8Array): Promise<void> {
    const r = this.input.request;
    this.#binding = {
      bindingKey,
      handoffId: r.handoffId,
      destNodeId: r.decode.nodeId,
      tenantId: r.tenantId,
    };
    this.#stream = await this.#decoder!.openHandoffStream({
      handoffId: r.handoffId,
      attempt: this.#state.attempt,
    });
  }

  /**
   * A retry: a fresh handoff stream (and, after a connection loss, a fresh connection), and
   * every chunk fed again from seq 0 under the new reservation's binding key.
   */
  async #restart(reason: AbortReason): Promise<void> {
    await this.#stream?.abort("retry").catch(() => {});
    this.#stream = null;
    this.#binding = null;
    this.#feedIndex = 0;
    this.#end.restart();
    this.#stagedAcks = 0;
    // A connection that failed once is not trusted again, even if its reader has not noticed.
    if (reason === "connection-lost" || this.#decoder === null) await this.#connect();
  }

  /** Hands queued chunks (then the manifest) to the table while it can take them. */
  async #pumpExport(): Promise<void> {
    if (this.#exportError !== null) {
      this.#localFailure = `Prefill or export failed: ${(this.#exportError as Error)?.message}`;
      this.#exportError = null;
      return await this.#feed({ type: "ExportFailed" });
    }
    // One chunk at a time while events wait: a cancel, an abort or a timer must not sit
    // behind a backlog of sends on a slow link.
    let fed = 0;
    while (prefillerCanExport(this.#state) && this.#feedIndex < this.#retained.length) {
      if (fed++ > 0 && this.#events.size > 0) return;
      const header = this.#retained.header(this.#feedIndex++);
      this.#telemetry.push({
        type: "chunk-queued",
        atMs: performance.now(),
        seq: header.seq,
        kind: header.kind,
        bytes: header.payloadBytes,
      });
      await this.#feed({ type: "ChunkReady", header });
    }
    const allFed = this.#feedIndex === this.#retained.length;
    // Signed once the reservation's key is known.
    if (this.#binding === null) return;
    const manifest = allFed && prefillerCanExport(this.#state)
      ? await this.#end.manifest(this.#binding)
      : null;
    if (manifest) await this.#feed({ type: "ExportDone", manifest });
    if (this.#binding === null) return; // that step restarted the attempt
    const probe = await this.#end.probe(this.#binding, this.input.probeDigestHook);
    if (probe) await this.#feed({ type: "ProbeReady", ...probe });
  }

  async #runExporter(): Promise<void> {
    const wake = () => this.#events.tryPush({ type: "Tick", elapsedMs: 0 });
    const end = await runExport(this.input, {
      telemetry: this.#telemetry,
      retained: this.#retained,
      wake,
      onTailExported: (manifest) => this.#end.tailExported(manifest),
    });
    if (end.done) {
      this.#end.probeDone(end.done.result.probeLogitsSha256);
      this.#exportResult = end.done;
    } else if (end.error !== null) {
      this.#exportError = end.error;
    }
    wake(); // the loop sees the end
  }

  #result(outcome: PrefillOutcome["outcome"], reason: AbortReason | null, message: string | null) {
    const { handoffId } = this.input.request;
    const promptTokens = this.input.prompt.length;
    this.#end.manifestLeft();
    const head = { type: "PrefillOutcome" as const, handoffId, outcome, reason, message };
    const out: PrefillOutcome = { ...head, promptTokens, telemetry: null };
    return out;
  }
}
