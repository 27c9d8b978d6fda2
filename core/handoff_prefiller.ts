/**
 * The prefiller's side of the two-phase handoff (with the coordinator folded in, as for a
 * single scripted handoff): reserve, stream under credit, send the manifest, then the probe
 * digest when the manifest said it follows (`ProbeReady`: the prefiller's own probe decode
 * runs while the decoder verifies and imports), wait for CommitAck while retaining the
 * state, then erase it. Failures end in one of three
 * dispositions: retry (a fresh reservation, re-streaming the retained state), fallback
 * (recompute the prompt on the decoder) or fail (error to the client).
 *
 * @module
 */
import type { ChunkHeader } from "./chunk.ts";
import {
  type AbortReason,
  DEFAULT_HANDOFF_TIMING,
  type HandoffAction,
  type HandoffEvent,
  type HandoffEventType,
  type HandoffTiming,
  isAbortReason,
  isTerminal,
  Phase,
  type PhaseName,
  phaseName,
  type ReserveRequest,
  type StepResult,
} from "./handoff.ts";
import type { FinalManifest } from "./manifest.ts";
import { type ModelFamily, STATE_SCHEMA_VERSION } from "./schema.ts";
import { BINDING_KEY_BYTES, BINDING_TAG_BYTES } from "./binding.ts";
import { isHex, SHA256_BYTES } from "./bytes.ts";
import { isCount, isMessage, rejectEvent } from "./_handoff_common.ts";

/** What the prefiller knows about the request when the handoff starts. */
export interface PrefillerParams {
  handoffId: string;
  tenantId: string;
  sourceNodeId: string;
  destNodeId: string;
  identityDigest: string;
  family: ModelFamily;
  promptTokens: number;
  stateBytesEstimate: number;
  contextTokensNeeded: number;
}

/** How a failed attempt ends: try again, recompute on the decoder, or error to the client. */
export type Disposition = "retry" | "fallback" | "fail";

/** The prefiller's whole state: plain data, replaced (never mutated) by each step. */
export interface PrefillerState {
  readonly role: "prefiller";
  readonly phase: Phase;
  readonly params: PrefillerParams;
  readonly timing: HandoffTiming;
  readonly attempt: number;
  /** Bytes the decoder still allows in flight. */
  readonly creditBytes: number;
  /** At most one chunk waiting for credit: the exporter waits while this is set. */
  readonly pending: ChunkHeader | null;
  /** The signed manifest, held until every chunk has left. */
  readonly manifest: FinalManifest | null;
  /** The signed probe digest, held until the manifest has left. */
  readonly probe: { logitsSha256: string; tag: string } | null;
  /** Whether this attempt's ProbeDigest has left (at most one per attempt). */
  readonly probeSent: boolean;
  readonly phaseMs: number;
  readonly stallMs: number;
  /** Time since the manifest first left; null before. Bounded by `leaseMs`. */
  readonly retainedMs: number | null;
  readonly outcome: { reason: AbortReason; disposition: Disposition } | null;
}

/**
 * A prefiller in phase Idle; feed it `{ type: "Start" }`.
 *
 * @example
 * ```ts
 * let s = createPrefiller(params);
 * ({ state: s, actions } = prefillerStep(s, { type: "Start" })); // send ReserveRequest
 * ```
 */
export function createPrefiller(
  params: PrefillerParams,
  timing: HandoffTiming = DEFAULT_HANDOFF_TIMING,
): PrefillerState {
  return {
    role: "prefiller",
    phase: Phase.Idle,
    params,
    timing,
    attempt: 0,
    creditBytes: 0,
    pending: null,
    manifest: null,
    probe: null,
    probeSent: false,
    phaseMs: 0,
    stallMs: 0,
    retainedMs: null,
    outcome: null,
  };
}

/**
 * True when the exporter may hand over another chunk (`ChunkReady`) now; otherwise it
 * waits (the real backpressure signal), keeping at most one chunk held in the state.
 *
 * @example
 * ```ts
 * while (!prefillerCanExport(state)) await nextEvent();
 * ```
 */
export function prefillerCanExport(s: PrefillerState): boolean {
  return (s.phase === Phase.Reserving || s.phase === Phase.Streaming) && s.pending === null;
}

type S = PrefillerState;
type Handler = (s: S, e: HandoffEvent) => StepResult<S>;

// Reasons worth a fresh reservation (transient), and those where the decoder can still
// serve the request by recomputing the prompt itself.
const RETRYABLE = new Set<AbortReason>([
  "reserve-timeout",
  "connection-lost",
  "invalid-state",
  "binding-tag",
  "import-failed",
  "credit-stall",
]);
const RECOMPUTE = new Set<AbortReason>([
  "identity-mismatch",
  "capability-missing",
  "invalid-state",
  "binding-tag",
  "credit-exceeded",
  "import-failed",
  "probe-failed",
  "reservation-expired",
  "export-failed",
]);

/**
 * What the prefiller does about `reason` in state `s`: retry while transient and allowed,
 * fall back to recompute on the decoder for state faults, otherwise fail to the client.
 *
 * @example
 * ```ts
 * dispositionOf(state, "connection-lost"); // "retry" (while retries and lease remain)
 * ```
 */
export function dispositionOf(s: S, reason: AbortReason): Disposition {
  const leaseLeft = s.retainedMs === null || s.retainedMs <= s.timing.leaseMs;
  if (RETRYABLE.has(reason) && s.attempt < s.timing.retriesMax && leaseLeft) return "retry";
  return RECOMPUTE.has(reason) ? "fallback" : "fail";
}

function _reserveRequest(s: S): ReserveRequest {
  const p = s.params;
  return {
    type: "ReserveRequest",
    handoffId: p.handoffId,
    attempt: s.attempt,
    tenantId: p.tenantId,
    sourceNodeId: p.sourceNodeId,
    destNodeId: p.destNodeId,
    identityDigest: p.identityDigest,
    schemaVersion: STATE_SCHEMA_VERSION,
    family: p.family,
    promptTokens: p.promptTokens,
    stateBytesEstimate: p.stateBytesEstimate,
    contextTokensNeeded: p.contextTokensNeeded,
  };
}

function _fail(s: S, reason: AbortReason, notify: boolean): StepResult<S> {
  const { handoffId } = s.params;
  const actions: HandoffAction[] = notify
    ? [{ type: "send", msg: { type: "AbortNotice", handoffId, attempt: s.attempt, reason } }]
    : [];
  const disposition = dispositionOf(s, reason);
  if (disposition === "retry") {
    const next: S = {
      ...s,
      phase: Phase.Reserving,
      attempt: s.attempt + 1,
      creditBytes: 0,
      pending: null,
      manifest: null,
      probe: null,
      probeSent: false,
      phaseMs: 0,
      stallMs: 0,
    };
    actions.push({ type: "retry", attempt: next.attempt, reason });
    actions.push({ type: "send", msg: _reserveRequest(next) });
    return { state: next, actions };
  }
  actions.push({ type: "erase-retained" }, { type: "release" });
  actions.push(
    disposition === "fallback" ? { type: "fallback", reason } : { type: "fail", reason },
  );
  const next: S = {
    ...s,
    phase: Phase.Failed,
    pending: null,
    manifest: null,
    probe: null,
    outcome: { reason, disposition },
  };
  return { state: next, actions };
}

function _protocolError(s: S, e: HandoffEvent, detail: string): StepResult<S> {
  const failed = _fail(s, "protocol-error", true);
  return { ...failed, rejected: rejectEvent(s, e, detail).rejected };
}

// Sends the waiting chunk when credit allows, then the manifest once no chunk waits, then a
// held probe digest once the manifest has left.
function _flush(s: S, actions: HandoffAction[] = []): StepResult<S> {
  let next = s;
  const { handoffId } = s.params;
  if (next.pending && next.pending.payloadBytes <= next.creditBytes) {
    const header = next.pending;
    actions.push({
      type: "send",
      msg: { type: "StateChunk", handoffId, attempt: s.attempt, header },
    });
    next = {
      ...next,
      pending: null,
      creditBytes: next.creditBytes - header.payloadBytes,
      stallMs: 0,
    };
  }
  if (!next.pending && next.manifest) {
    const manifest = next.manifest;
    actions.push({
      type: "send",
      msg: { type: "FinalManifest", handoffId, attempt: s.attempt, manifest },
    });
    next = {
      ...next,
      phase: Phase.Validating,
      manifest: null,
      phaseMs: 0,
      retainedMs: next.retainedMs ?? 0,
    };
  }
  if (next.probe && next.phase === Phase.Validating) {
    const { logitsSha256, tag } = next.probe;
    actions.push({
      type: "send",
      msg: { type: "ProbeDigest", handoffId, attempt: s.attempt, logitsSha256, tag },
    });
    // The commit wait starts over: it bounds the decoder's answer to the last message, not this
    // side's own probe decode (which `leaseMs`, running since the manifest left, still bounds).
    next = { ...next, probe: null, probeSent: true, phaseMs: 0 };
  }
  return { state: next, actions };
}

const onStart: Handler = (s) => {
  const next: S = { ...s, phase: Phase.Reserving, phaseMs: 0 };
  return { state: next, actions: [{ type: "send", msg: _reserveRequest(next) }] };
};

const onReserveAccepted: Handler = (s, e) => {
  if (e.type !== "ReserveAccepted") return _protocolError(s, e, "wrong event");
  const keyOk = e.bindingKey instanceof Uint8Array && e.bindingKey.length === BINDING_KEY_BYTES;
  if (!isCount(e.creditBytes) || !keyOk) return _protocolError(s, e, "malformed reservation");
  const next: S = { ...s, phase: Phase.Streaming, creditBytes: e.creditBytes, phaseMs: 0 };
  return _flush(next, [{ type: "bind", bindingKey: e.bindingKey }]);
};

const onCredit: Handler = (s, e) => {
  if (e.type !== "TransferCredit" || !isCount(e.creditBytes)) {
    return _protocolError(s, e, "malformed credit");
  }
  const next: S = { ...s, creditBytes: s.creditBytes + e.creditBytes };
  return s.phase === Phase.Streaming ? _flush(next) : { state: next, actions: [] };
};

const onChunkReady: Handler = (s, e) => {
  if (e.type !== "ChunkReady" || e.header?.handoffId !== s.params.handoffId) {
    return _protocolError(s, e, "chunk of another handoff");
  }
  if (s.pending) return _protocolError(s, e, "the exporter did not wait for credit");
  if (!isCount(e.header.payloadBytes)) return _protocolError(s, e, "malformed chunk size");
  const next: S = { ...s, pending: e.header, stallMs: 0 };
  return s.phase === Phase.Streaming ? _flush(next) : { state: next, actions: [] };
};

const onExportDone: Handler = (s, e) => {
  if (e.type !== "ExportDone" || e.manifest?.handoffId !== s.params.handoffId) {
    return _protocolError(s, e, "manifest of another handoff");
  }
  if (s.manifest) return _protocolError(s, e, "export finished twice");
  const next: S = { ...s, manifest: e.manifest };
  return s.phase === Phase.Streaming ? _flush(next) : { state: next, actions: [] };
};

const onProbeReady: Handler = (s, e) => {
  const ok = e.type === "ProbeReady" && isHex(e.logitsSha256, SHA256_BYTES) &&
    isHex(e.tag, BINDING_TAG_BYTES);
  if (e.type !== "ProbeReady" || !ok) {
    return _protocolError(s, e, "malformed probe digest");
  }
  if (s.probe || s.probeSent) return _protocolError(s, e, "probe digest ready twice");
  const next: S = { ...s, probe: { logitsSha256: e.logitsSha256, tag: e.tag } };
  return _flush(next);
};

const onCommitAck: Handler = (s, e) => {
  if (e.type !== "CommitAck" || !isCount(e.position)) return _protocolError(s, e, "malformed ack");
  const next: S = { ...s, phase: Phase.Released, retainedMs: null };
  const actions: HandoffAction[] = [
    { type: "erase-retained" },
    { type: "release" },
    { type: "committed", position: e.position },
  ];
  return { state: next, actions };
};

const onAbortNotice: Handler = (s, e) => {
  const reason = e.type === "AbortNotice" && isAbortReason(e.reason) ? e.reason : "protocol-error";
  return _fail(s, reason, false);
};
const onConnectionLost: Handler = (s) => _fail(s, "connection-lost", false);
const onCancel: Handler = (s) => _fail(s, "cancelled", s.phase !== Phase.Idle);
const onExportFailed: Handler = (s) => _fail(s, "export-failed", true);

const onTick: Handler = (s, e) => {
  if (e.type !== "Tick" || !Number.isFinite(e.elapsedMs) || e.elapsedMs < 0) {
    return rejectEvent(s, e, "elapsedMs must be a finite, non-negative duration");
  }
  if (isTerminal(s.phase) || s.phase === Phase.Idle) return { state: s, actions: [] };
  const t = s.timing;
  const next: S = {
    ...s,
    phaseMs: s.phaseMs + e.elapsedMs,
    stallMs: s.phase === Phase.Streaming && s.pending ? s.stallMs + e.elapsedMs : 0,
    retainedMs: s.retainedMs === null ? null : s.retainedMs + e.elapsedMs,
  };
  if (next.retainedMs !== null && next.retainedMs > t.leaseMs) {
    return _fail(next, "lease-expired", true);
  }
  if (s.phase === Phase.Reserving && next.phaseMs > t.reserveTimeoutMs) {
    return _fail(next, "reserve-timeout", true);
  }
  if (next.stallMs > t.creditStallMs) return _fail(next, "credit-stall", true);
  if (s.phase === Phase.Validating && next.phaseMs > t.commitTimeoutMs) {
    return _fail(next, "commit-timeout", true);
  }
  return { state: next, actions: [] };
};

const FAILURES = {
  AbortNotice: onAbortNotice,
  ConnectionLost: onConnectionLost,
  Cancel: onCancel,
} satisfies Partial<Record<HandoffEventType, Handler>>;

/**
 * The prefiller's transition table: phase -> event -> handler. A pair that is not listed is
 * a protocol error (Tick is valid everywhere).
 */
export const PREFILLER_TABLE: Readonly<
  Partial<Record<PhaseName, Partial<Record<HandoffEventType, Handler>>>>
> = {
  Idle: { Start: onStart, Cancel: onCancel },
  Reserving: {
    ReserveAccepted: onReserveAccepted,
    ChunkReady: onChunkReady,
    ExportDone: onExportDone,
    ProbeReady: onProbeReady,
    ExportFailed: onExportFailed,
    ...FAILURES,
  },
  Streaming: {
    TransferCredit: onCredit,
    ChunkReady: onChunkReady,
    ExportDone: onExportDone,
    ProbeReady: onProbeReady,
    ExportFailed: onExportFailed,
    ...FAILURES,
  },
  // The probe decode runs after the manifest left: its digest, or its failure, comes here.
  Validating: {
    CommitAck: onCommitAck,
    TransferCredit: onCredit,
    ProbeReady: onProbeReady,
    ExportFailed: onExportFailed,
    ...FAILURES,
  },
};

/**
 * One pure transition of the prefiller. Never throws: an event that is not valid in the
 * current phase comes back with `rejected` set; once the handoff has started (and until it
 * ends) it also fails the attempt closed (AbortNotice "protocol-error", state erased).
 *
 * @example
 * ```ts
 * const { state, actions } = prefillerStep(s, { type: "Tick", elapsedMs: 50 });
 * for (const a of actions) await io.perform(a);
 * ```
 */
export function prefillerStep(s: S, e: HandoffEvent): StepResult<S> {
  if (typeof e !== "object" || e === null) {
    return rejectEvent(s, { type: String(e) }, "not an event");
  }
  if (e.type === "Tick") return onTick(s, e);
  if (isMessage(e) && (e.handoffId !== s.params.handoffId || e.attempt !== s.attempt)) {
    return rejectEvent(s, e, "stray message of another handoff or attempt");
  }
  if (isTerminal(s.phase)) return rejectEvent(s, e, "the handoff is over");
  // Own keys only: a peer's type "constructor" or "__proto__" must not reach Object.prototype.
  const row = PREFILLER_TABLE[phaseName(s.phase)];
  const handler = row && Object.hasOwn(row, e.type) ? row[e.type] : undefined;
  if (handler) return handler(s, e);
  if (s.phase === Phase.Idle) return rejectEvent(s, e, "the handoff has not started");
  return _protocolError(s, e, "not valid in this phase");
}
