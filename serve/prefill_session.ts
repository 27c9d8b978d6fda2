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
  buildManifest,
  componentOf,
  computeChunkTag,
  contextTokensNeeded,
  createPrefiller,
  type FinalManifest,
  type HandoffAction,
  type HandoffEvent,
  type HandoffTiming,
  isAbortReason,
  LimitExceededError,
  type PrefillerState,
  prefillerCanExport,
  prefillerStep,
  signManifest,
} from "../core/mod.ts";
import type { BindingContext } from "../core/binding.ts";
import type { PrefillerTelemetryEvent } from "../core/telemetry.ts";
import type { HandoffSender, PeerConnection } from "../transport/mod.ts";
import type { Engine } from "./engine.ts";
import { type ExportedChunk, reexportPage, StateExporter } from "./exporter.ts";
import type { ResolvedIdentity } from "./identity.ts";
import type { PrefillOutcome, PrefillRequest } from "./messages.ts";
import type { MtpDraft } from "./mtp.ts";
import { CORE_MESSAGE_TYPES } from "./wire.ts";

/** Bounds of one prefill-side handoff, each named with its unit. */
export interface PrefillLimits {
  /** Exported chunks waiting to be sent; prefill pauses when this is reached. */
  exportQueueBytesMax: number;
  /** End-of-prompt components retained for a retry until CommitAck. */
  retainedBytesMax: number;
  /** How often the table's timers are advanced. */
  tickMs: number;
}

export const DEFAULT_PREFILL_LIMITS: Readonly<PrefillLimits> = {
  exportQueueBytesMax: 256 * 1024 * 1024,
  retainedBytesMax: 1024 * 1024 * 1024,
  tickMs: 50,
};

/** Pending events are few by construction (one chunk held, control messages bounded). */
const EVENTS_MAX = 4096;

interface LogEntry {
  chunk: ExportedChunk;
  /** Payload still held (end-of-prompt components, and KV pages not yet sent). */
  held: boolean;
}

export interface PrefillHandoffInput {
  request: PrefillRequest;
  prompt: Int32Array;
  engine: Engine;
  draft: MtpDraft | null;
  identity: ResolvedIdentity;
  /** Opens (or reopens, for a retry) an authenticated connection to the decode worker. */
  connectDecoder: () => Promise<PeerConnection>;
  sourceNodeId: string;
  timing: HandoffTiming;
  limits: PrefillLimits;
  cancel: AbortSignal;
}

export class PrefillHandoff {
  #state: PrefillerState;
  readonly #events = new BoundedQueue<HandoffEvent>(EVENTS_MAX);
  readonly #telemetry: PrefillerTelemetryEvent[] = [];
  readonly #log: LogEntry[] = [];
  #feedIndex = 0;
  #unsentBytes = 0;
  #retainedBytes = 0;
  #spaceWaiters: (() => void)[] = [];
  #exportDone: { manifest: Omit<FinalManifest, "tag">; firstLogitsSha256: string } | null =
    null;
  #exportError: unknown = null;
  #manifestFed = false;
  #decoder: PeerConnection | null = null;
  #stream: HandoffSender | null = null;
  #binding: BindingContext | null = null;
  #outcome: PrefillOutcome | null = null;
  #stagedAcks = 0;
  #decoderAlive = false;

  constructor(readonly input: PrefillHandoffInput) {
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
    const exporting = this.#runExporter();
    try {
      if (!await this.#connect()) return this.#finish();
      await this.#feed({ type: "Start" });
      while (this.#outcome === null) {
        await this.#pumpExport();
        if (this.#outcome !== null) break;
        const event = await this.#events.shift();
        if (event === undefined) break;
        await this.#feed(event);
      }
    } finally {
      clearInterval(ticker);
      this.input.cancel.removeEventListener("abort", onCancel);
      this.#stopExport();
      await exporting;
    }
    return this.#finish();
  }

  #finish(): PrefillOutcome {
    this.#eraseRetained();
    const o = this.#outcome ?? this.#result("failed", "protocol-error", "handoff ended early");
    const probe = this.input.request.probe && o.outcome === "committed";
    return {
      ...o,
      events: this.#telemetry,
      firstLogitsSha256: probe ? this.#exportDone?.firstLogitsSha256 ?? null : null,
    };
  }

  async #connect(): Promise<boolean> {
    try {
      this.#decoder?.close().catch(() => {});
      const decoder = await this.input.connectDecoder();
      this.#decoder = decoder;
      this.#decoderAlive = true;
      this.#listen(decoder);
      return true;
    } catch (error) {
      this.#outcome = this.#result("failed", "connection-lost", (error as Error).message);
      return false;
    }
  }

  /** Moves the decoder's control messages for this handoff, and its loss, into events. */
  #listen(decoder: PeerConnection): void {
    const id = this.input.request.handoffId;
    (async () => {
      try {
        for await (const msg of decoder) {
          const h = msg.header as Record<string, unknown>;
          if (h.handoffId !== id || !CORE_MESSAGE_TYPES.has(h.type as string)) continue;
          if (h.type === "TransferCredit") this.#noteStaged();
          if (!this.#events.tryPush(h as unknown as HandoffEvent)) break;
        }
      } catch {
        // The connection failed: reported below as ConnectionLost.
      }
      if (this.#decoder === decoder) {
        this.#decoderAlive = false;
        this.#events.tryPush({ type: "ConnectionLost" });
      }
    })();
  }

  #noteStaged(): void {
    // The decoder grants credit back once per KV page it has imported, in page order, so the
    // k-th grant proves page k arrived and was staged (on this process's clock).
    const page = this.#log.filter((e) => e.chunk.header.kind === "kv-page")[this.#stagedAcks++];
    if (page) {
      this.#telemetry.push({
        type: "chunk-staged",
        atMs: performance.now(),
        seq: page.chunk.header.seq,
        bytes: page.chunk.header.payloadBytes,
      });
    }
  }

  async #feed(event: HandoffEvent): Promise<void> {
    const r = prefillerStep(this.#state, event);
    this.#state = r.state;
    for (const action of r.actions) await this.#perform(action);
  }

  async #perform(a: HandoffAction): Promise<void> {
    const now = performance.now();
    switch (a.type) {
      case "send":
        return await this.#send(a.msg);
      case "bind":
        return await this.#bind(a.bindingKey);
      case "retry":
        this.#telemetry.push({ type: "retry", atMs: now, reason: a.reason });
        return await this.#restart();
      case "erase-retained":
        return this.#eraseRetained();
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
        this.#outcome = this.#result("fallback", a.reason, describe(a.reason));
        return;
      case "fail":
        this.#outcome = this.#result("failed", a.reason, describe(a.reason));
        return;
    }
  }

  async #send(msg: HandoffEvent & { type: string }): Promise<void> {
    try {
      if (msg.type === "StateChunk") return await this.#sendChunk(msg.header.seq);
      if (msg.type === "FinalManifest") {
        await this.#stream!.finish({ ...msg } as unknown as Record<string, unknown>);
        this.#telemetry.push({ type: "manifest-sent", atMs: performance.now() });
        return;
      }
      await this.#decoder!.send({ ...msg } as unknown as Record<string, unknown>);
    } catch {
      this.#events.tryPush({ type: "ConnectionLost" });
    }
  }

  async #sendChunk(seq: number): Promise<void> {
    const entry = this.#log[seq];
    const { header } = entry.chunk;
    const payload = entry.held
      ? entry.chunk.payload
      : await reexportPage(this.input.engine.ctx, header);
    const tag = await computeChunkTag(this.#binding!, header);
    const t0 = performance.now();
    await this.#stream!.send({
      type: "StateChunk",
      handoffId: header.handoffId,
      attempt: this.#state.attempt,
      header,
      tag,
    } as unknown as Record<string, unknown>, payload);
    const atMs = performance.now();
    this.#telemetry.push({
      type: "chunk-sent",
      atMs,
      seq,
      kind: header.kind,
      bytes: header.payloadBytes,
      durationMs: atMs - t0,
    });
    if (header.kind === "kv-page" && entry.held) {
      // Sent: the context still holds these cells; a retry exports them again.
      payload.fill(0);
      entry.held = false;
      this.#unsentBytes -= header.payloadBytes;
      for (const wake of this.#spaceWaiters.splice(0)) wake();
    }
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

  /** A retry: reconnect if the connection is gone, and feed every chunk again from seq 0. */
  async #restart(): Promise<void> {
    await this.#stream?.abort("retry").catch(() => {});
    this.#stream = null;
    this.#feedIndex = 0;
    this.#manifestFed = false;
    this.#stagedAcks = 0;
    if (!this.#decoderAlive) await this.#connect();
  }

  /** Hands queued chunks (then the manifest) to the table while it can take them. */
  async #pumpExport(): Promise<void> {
    if (this.#exportError !== null) {
      this.#exportError = null;
      return await this.#feed({ type: "ExportFailed" });
    }
    while (prefillerCanExport(this.#state) && this.#feedIndex < this.#log.length) {
      const { header } = this.#log[this.#feedIndex++].chunk;
      this.#telemetry.push({
        type: "chunk-queued",
        atMs: performance.now(),
        seq: header.seq,
        kind: header.kind,
        bytes: header.payloadBytes,
      });
      await this.#feed({ type: "ChunkReady", header });
    }
    const allFed = this.#feedIndex === this.#log.length;
    if (this.#exportDone && allFed && !this.#manifestFed && prefillerCanExport(this.#state)) {
      if (this.#binding === null) return; // signed once the reservation's key is known
      this.#manifestFed = true;
      const manifest = await signManifest(this.#exportDone.manifest, this.#binding);
      await this.#feed({ type: "ExportDone", manifest });
    }
  }

  async #runExporter(): Promise<void> {
    const r = this.input.request;
    const exporter = new StateExporter(
      this.input.engine,
      this.input.identity,
      r.handoffId,
      this.input.draft,
    );
    const sampling = { temperature: r.sampling.temperature, topK: r.sampling.topK, topP: r.sampling.topP };
    try {
      const result = await exporter.run(
        this.input.prompt,
        sampling,
        { seed: r.sampling.seed, draws: 0 },
        (chunk, exportMs) => this.#accept(chunk, exportMs),
      );
      const n = result.nTokens;
      this.#exportDone = {
        manifest: buildManifest({
          handoffId: r.handoffId,
          identityDigest: this.input.identity.digest,
          family: this.input.identity.numerical.family,
          components: this.#log.map((e) => componentOf(e.chunk.header)),
          logical: { position: n, tokenCount: n },
          probe: { logitsSha256: result.probeLogitsSha256 },
        }),
        firstLogitsSha256: result.firstLogitsSha256,
      };
    } catch (error) {
      if (!(error instanceof ExportStopped)) this.#exportError = error;
    }
    this.#events.tryPush({ type: "Tick", elapsedMs: 0 }); // wake the loop
  }

  /** The exporter's sink: log the chunk, then wait while too many bytes are unsent. */
  async #accept(chunk: ExportedChunk, exportMs: number): Promise<void> {
    const now = performance.now();
    if (chunk.header.kind === "kv-page") {
      this.#telemetry.push({ type: "prefill-chunk-done", atMs: now - exportMs, tokens: chunk.header.tokenRange[1] - chunk.header.tokenRange[0], cached: false });
    }
    this.#telemetry.push({
      type: "export",
      atMs: now,
      kind: chunk.header.kind,
      bytes: chunk.header.payloadBytes,
      durationMs: exportMs,
    });
    if (chunk.header.kind === "kv-page") this.#unsentBytes += chunk.header.payloadBytes;
    else this.#retainedBytes += chunk.header.payloadBytes;
    if (this.#retainedBytes > this.input.limits.retainedBytesMax) {
      throw new LimitExceededError(
        `End-of-prompt state of ${this.#retainedBytes} bytes exceeds retainedBytesMax`,
      );
    }
    this.#log.push({ chunk, held: true });
    this.#events.tryPush({ type: "Tick", elapsedMs: 0 }); // wake the loop to feed it
    while (this.#unsentBytes > this.input.limits.exportQueueBytesMax && !this.#stopped) {
      await new Promise<void>((resolve) => this.#spaceWaiters.push(resolve));
    }
    if (this.#stopped) throw new ExportStopped();
  }

  #stopped = false;

  #stopExport(): void {
    this.#stopped = true;
    for (const wake of this.#spaceWaiters.splice(0)) wake();
  }

  /** Zeroes and drops every retained payload and the context's KV data. */
  #eraseRetained(): void {
    for (const entry of this.#log) {
      if (entry.held) entry.chunk.payload.fill(0);
      entry.held = false;
    }
    this.#retainedBytes = 0;
    this.#unsentBytes = 0;
  }

  #result(
    outcome: PrefillOutcome["outcome"],
    reason: AbortReason | null,
    message: string | null,
  ): PrefillOutcome {
    return {
      type: "PrefillOutcome",
      handoffId: this.input.request.handoffId,
      outcome,
      reason,
      message,
      promptTokens: this.input.prompt.length,
      events: [],
      firstLogitsSha256: null,
    };
  }

  /** The decoder connection (for closing by the owner). */
  get decoder(): PeerConnection | null {
    return this.#decoder;
  }
}

class ExportStopped extends Error {}

const REASON_TEXT: Partial<Record<AbortReason, string>> = {
  "identity-mismatch": "the decode worker's numerical identity differs from this worker's",
  "capability-missing": "the decode worker lacks the capabilities for this handoff",
  "connection-lost": "the connection to the decode worker was lost",
  "commit-timeout": "the decode worker did not acknowledge the commit in time",
  "lease-expired": "the retained state's lease expired before the commit",
  "probe-failed": "the decode worker's continuation probe did not match",
  "cancelled": "the request was cancelled",
  "reserve-timeout": "the decode worker did not answer the reservation in time",
  "reserve-rejected": "the decode worker refused the reservation",
};

/** A one-line description of an abort reason (no content). */
export function describe(reason: AbortReason): string {
  return REASON_TEXT[reason] ?? `handoff aborted: ${isAbortReason(reason) ? reason : "unknown"}`;
}
