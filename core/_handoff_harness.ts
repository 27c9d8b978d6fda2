/**
 * A synchronous in-memory I/O loop for handoff tests: it carries out both roles' actions
 * (delivering messages, answering reserve/stage/verify/import/probe) and records a trace.
 * Failure injection: `answer` may replace the decoder's result event for any action.
 * Private (underscore): tests only.
 */
import { completeStream, DIGEST, HANDOFF_ID } from "./_test_fixtures.ts";
import { newBindingKey } from "./binding.ts";
import type { ChunkHeader } from "./chunk.ts";
import {
  type HandoffAction,
  type HandoffEvent,
  type HandoffMessage,
  type HandoffTiming,
  isTerminal,
  resolveHandoffTiming,
} from "./handoff.ts";
import { createDecoder, type DecoderState, decoderStep } from "./handoff_decoder.ts";
import {
  createPrefiller,
  prefillerCanExport,
  type PrefillerParams,
  type PrefillerState,
  prefillerStep,
} from "./handoff_prefiller.ts";
import { buildManifest, componentOf, type FinalManifest } from "./manifest.ts";

export const PARAMS: PrefillerParams = {
  handoffId: HANDOFF_ID,
  tenantId: "tenant-a",
  sourceNodeId: "node-m3",
  destNodeId: "node-m1",
  identityDigest: DIGEST,
  family: "hybrid",
  promptTokens: 2048,
  stateBytesEstimate: 1 << 20,
  contextTokensNeeded: 4096,
};

/** A test manifest; `probe` as in UnsignedManifest (null: the digest follows it). */
export function testManifest(
  stream: readonly ChunkHeader[],
  n: number,
  probe?: { logitsSha256: string | null },
): FinalManifest {
  const unsigned = buildManifest({
    handoffId: HANDOFF_ID,
    identityDigest: DIGEST,
    family: "hybrid",
    components: stream.map(componentOf),
    logical: { position: n, tokenCount: n },
    probe,
  });
  return { ...unsigned, tag: "ee".repeat(32) };
}

/** The prefiller's probe digest in `runHandoff` (equal to the decoder's by default). */
export const PREFILLER_PROBE = "ab".repeat(32);

export interface TraceEntry {
  role: "prefiller" | "decoder";
  event: string;
  actions: string[];
  rejected: boolean;
}

export class Harness {
  p: PrefillerState;
  d: DecoderState;
  toDecoder: HandoffMessage[] = [];
  toPrefiller: HandoffMessage[] = [];
  local: { role: "prefiller" | "decoder"; event: HandoffEvent }[] = [];
  trace: TraceEntry[] = [];
  actions: { role: string; action: HandoffAction }[] = [];
  creditBytes: number;
  /** What the exporter produced (retained for retries) and what it has yet to hand over. */
  exported: HandoffEvent[] = [];
  exportQueue: HandoffEvent[] = [];
  /** Replace the decoder's answer to an action (failure injection). */
  answer: (action: HandoffAction) => HandoffEvent | null | undefined = () => undefined;
  deliver = true;
  /** The digest the decoder's own probe yields (the prefiller's, unless a test changes it). */
  probeDigest = PREFILLER_PROBE;

  constructor(options: { timing?: Partial<HandoffTiming>; creditBytes?: number } = {}) {
    const timing = resolveHandoffTiming(options.timing);
    this.p = createPrefiller(PARAMS, timing);
    this.d = createDecoder(timing);
    this.creditBytes = options.creditBytes ?? 1 << 30;
  }

  feedPrefiller(event: HandoffEvent): void {
    const r = prefillerStep(this.p, event);
    this.p = r.state;
    this.#record("prefiller", event, r.actions, r.rejected !== undefined);
    for (const a of r.actions) this.#performPrefiller(a);
  }

  feedDecoder(event: HandoffEvent): void {
    // The decoder's I/O loop opens a fresh session for each reservation (a retry included).
    if (event.type === "ReserveRequest" && isTerminal(this.d.phase)) {
      this.d = createDecoder(this.d.timing);
    }
    const r = decoderStep(this.d, event);
    this.d = r.state;
    this.#record("decoder", event, r.actions, r.rejected !== undefined);
    for (const a of r.actions) this.#performDecoder(a);
  }

  #record(
    role: "prefiller" | "decoder",
    event: HandoffEvent,
    actions: HandoffAction[],
    rejected: boolean,
  ) {
    this.trace.push({ role, event: event.type, actions: actions.map(_name), rejected });
    for (const action of actions) this.actions.push({ role, action });
  }

  #performPrefiller(a: HandoffAction): void {
    if (a.type === "send" && this.deliver) this.toDecoder.push(a.msg);
    // A retry re-streams the retained state from the first chunk.
    if (a.type === "retry") this.exportQueue = [...this.exported];
  }

  #performDecoder(a: HandoffAction): void {
    const injected = this.answer(a);
    if (injected === null) return;
    if (injected) return void this.local.push({ role: "decoder", event: injected });
    if (a.type === "send" && this.deliver) this.toPrefiller.push(a.msg);
    if (a.type === "reserve") {
      this.local.push({
        role: "decoder",
        event: { type: "Reserved", creditBytes: this.creditBytes, bindingKey: newBindingKey() },
      });
    }
    if (a.type === "stage") {
      const credit = a.header.kind === "kv-page" ? a.header.payloadBytes : 0;
      this.local.push({ role: "decoder", event: { type: "ChunkStaged", creditBytes: credit } });
    }
    if (a.type === "verify") this.local.push({ role: "decoder", event: { type: "Verified" } });
    if (a.type === "import") this.local.push({ role: "decoder", event: { type: "Imported" } });
    if (a.type === "probe") {
      const event: HandoffEvent = { type: "ProbeDone", logitsSha256: this.probeDigest };
      this.local.push({ role: "decoder", event });
    }
  }

  /** Delivers queued messages and local results until nothing moves. */
  pump(stepsMax = 10_000): void {
    for (let i = 0; i < stepsMax; i++) {
      const local = this.local.shift();
      if (local) {
        if (local.role === "decoder") this.feedDecoder(local.event);
        else this.feedPrefiller(local.event);
        continue;
      }
      const toD = this.toDecoder.shift();
      if (toD) {
        this.feedDecoder(toD);
        continue;
      }
      const toP = this.toPrefiller.shift();
      if (toP) {
        this.feedPrefiller(toP);
        continue;
      }
      // The probe digest comes after the manifest left, when the table no longer exports.
      const probeNext = this.exportQueue[0]?.type === "ProbeReady" && !isTerminal(this.p.phase);
      if (this.exportQueue.length > 0 && (prefillerCanExport(this.p) || probeNext)) {
        this.feedPrefiller(this.exportQueue.shift()!);
        continue;
      }
      return;
    }
    throw new Error("harness did not settle");
  }

  /**
   * Runs a whole handoff: Start, every chunk as credit allows, then the manifest; with
   * `probe` "inline" the manifest carries the probe digest, with "follows" a ProbeReady
   * (digest `PREFILLER_PROBE`) comes after it.
   */
  runHandoff(
    n = 2048,
    probe: "none" | "inline" | "follows" = "none",
  ): { stream: ChunkHeader[]; manifest: FinalManifest } {
    const stream = completeStream("hybrid", n);
    const digest = probe === "none" ? undefined : {
      logitsSha256: probe === "inline" ? PREFILLER_PROBE : null,
    };
    const manifest = testManifest(stream, n, digest);
    this.exported = [
      ...stream.map((header): HandoffEvent => ({ type: "ChunkReady", header })),
      { type: "ExportDone", manifest },
    ];
    if (probe === "follows") {
      this.exported.push({
        type: "ProbeReady",
        logitsSha256: PREFILLER_PROBE,
        tag: "cd".repeat(32),
      });
    }
    this.exportQueue = [...this.exported];
    this.feedPrefiller({ type: "Start" });
    this.pump();
    return { stream, manifest };
  }

  actionsOf(role: string, type: string): HandoffAction[] {
    return this.actions.filter((a) => a.role === role && a.action.type === type).map((a) =>
      a.action
    );
  }
}

function _name(a: HandoffAction): string {
  return a.type === "send" ? `send ${a.msg.type}` : a.type;
}
