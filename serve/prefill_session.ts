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
  type FinalManifestMessage,
  HandoffAbortedError,
  type HandoffAction,
  type HandoffEvent,
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
import type { ExportResult } from "./exporter.ts";
import type { PrefillHandoffInput } from "./_prefill_input.ts";
import { RetainedState } from "./_retained_state.ts";
import { runExport } from "./_export_run.ts";
import { StreamEnd } from "./_stream_end.ts";
import {
  connectAttempt,
  listenToDecoder,
  sendManifest,
  sendStateChunk,
  stagedPage,
} from "./_prefill_io.ts";
import {
  completedHere,
  lostDecoderToComplete,
  prefillerFor,
  prefillOutcome,
} from "./_prefill_table.ts";
import { describeAbort, type PrefillOutcome } from "./messages.ts";
import type { PrefillCompletion } from "./prefill_completion.ts";

export {
  DEFAULT_PREFILL_LIMITS,
  type PrefillHandoffInput,
  type PrefillLimits,
} from "./_prefill_input.ts";

/** Pending events are few by construction (one chunk held, control messages bounded). */
const EVENTS_MAX = 4096;

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
    this.#state = prefillerFor(input);
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
    return lostDecoderToComplete(this.input.request, this.#outcome) &&
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
      const here = completedHere(o, done, this.input.request.sampling.seed);
      this.#completion = here.completion;
      return { ...here.outcome, telemetry: this.#telemetry.summary() };
    }
    return { ...o, telemetry: this.#telemetry.summary() };
  }

  async #connect(): Promise<boolean> {
    const previous = this.#decoder;
    this.#decoder = null;
    previous?.close();
    try {
      const { connectDecoder, timing } = this.input;
      const decoder = await connectAttempt(connectDecoder, previous, timing.reserveTimeoutMs);
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
    const deliver = (h: Record<string, unknown>) => {
      if (h.type === "TransferCredit") this.#noteStaged();
      return this.#events.tryPush(h as unknown as HandoffEvent);
    };
    listenToDecoder(decoder, this.input.request.handoffId, deliver, () => {
      if (this.#decoder === decoder) this.#connectionLost();
    });
  }

  /** A TransferCredit: the page it proves staged, on this clock. */
  #noteStaged(): void {
    const page = stagedPage(this.#retained.headers(), this.#stagedAcks++);
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
        const manifest = msg as FinalManifestMessage;
        return await sendManifest(this.#stream!, manifest, this.#end, this.#telemetry);
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
    await sendStateChunk({
      stream: this.#stream!,
      binding: this.#binding!,
      attempt: this.#state.attempt,
      retained: this.#retained,
      engine: this.input.engine,
      telemetry: this.#telemetry,
    }, seq);
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
      const header = this.#retained.header(this.#feedIndex);
      this.#telemetry.push({
        type: "chunk-queued",
        atMs: performance.now(),
        seq: header.seq,
        kind: header.kind,
        bytes: header.payloadBytes,
        readyAtMs: this.#retained.addedAt(this.#feedIndex++),
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

  /** The table's end: the outcome, and the probe decode no longer waits for the manifest. */
  #result(outcome: PrefillOutcome["outcome"], reason: AbortReason | null, message: string | null) {
    this.#end.manifestLeft();
    const { handoffId } = this.input.request;
    return prefillOutcome(handoffId, this.input.prompt.length, outcome, reason, message);
  }
}
