/**
 * The decoder's side of the two-phase handoff: reserve a session, stage chunks as they
 * arrive, verify the manifest against the staging ledger, import the snapshot components, run
 * the readiness probe, and only then commit (CommitAck + `allow-generate`), once the probe's
 * digest equals the prefiller's. That digest is in the manifest, or (`probe.logitsSha256:
 * null`) follows it in a ProbeDigest message, which may arrive at any point from the manifest
 * to the decoder's own probe: the table holds whichever comes first. Where the reservation
 * did not claim bitwise parity (`Reserved.parity: "not-claimed"`), the digests are not
 * compared: the decoder commits on its own probe and a digest that follows is ignored. Any
 * failure before commit releases the session uncommitted and tells the prefiller why.
 *
 * @module
 */
import { BINDING_KEY_BYTES } from "./binding.ts";
import { isCount, isMessage, rejectEvent } from "./_handoff_common.ts";
import { isHex, SHA256_BYTES } from "./bytes.ts";
import {
  type AbortReason,
  DEFAULT_HANDOFF_TIMING,
  type HandoffAction,
  type HandoffEvent,
  type HandoffEventType,
  type HandoffMessage,
  type HandoffTiming,
  isAbortReason,
  isTerminal,
  Phase,
  type PhaseName,
  phaseName,
  type StepResult,
} from "./handoff.ts";
import type { FinalManifest } from "./manifest.ts";

/** The decoder's whole state: plain data, replaced (never mutated) by each step. */
export interface DecoderState {
  readonly role: "decoder";
  readonly phase: Phase;
  readonly timing: HandoffTiming;
  /** Set by the ReserveRequest that opened this session. */
  readonly handoffId: string | null;
  readonly attempt: number;
  /** `stage` actions whose result has not come back yet. */
  readonly stagesInFlight: number;
  /** A manifest that arrived while stages were still in flight. */
  readonly manifest: FinalManifest | null;
  /**
   * Time since the ReserveRequest or the last staged chunk; bounded by `reservationMs` until
   * commit (a lease renewed by progress).
   */
  readonly reservedMs: number;
  readonly position: number | null;
  /** The prefiller's probe digest from a ProbeDigest message (its tag already checked). */
  readonly peerProbe: string | null;
  /** This decoder's own probe digest, once its probe ran. */
  readonly ownProbe: string | null;
  /** Whether the probe digests must be equal (bitwise parity claimed at reservation). */
  readonly probeCompared: boolean;
  readonly outcome: { reason: AbortReason } | null;
}

/**
 * A decoder session in phase Idle, waiting for a ReserveRequest.
 *
 * @example
 * ```ts
 * let d = createDecoder();
 * ({ state: d, actions } = decoderStep(d, reserveRequest)); // [{ type: "reserve", ... }]
 * ```
 */
export function createDecoder(timing: HandoffTiming = DEFAULT_HANDOFF_TIMING): DecoderState {
  return {
    role: "decoder",
    phase: Phase.Idle,
    timing,
    handoffId: null,
    attempt: 0,
    stagesInFlight: 0,
    manifest: null,
    reservedMs: 0,
    position: null,
    peerProbe: null,
    ownProbe: null,
    probeCompared: true,
    outcome: null,
  };
}

/**
 * The one question generation asks: true only after a passed probe and CommitAck.
 *
 * @example
 * ```ts
 * if (!canGenerate(session)) throw new HandoffAbortedError("not-committed", "...");
 * ```
 */
export function canGenerate(d: DecoderState): boolean {
  return d.phase === Phase.Committed;
}

type S = DecoderState;
type Handler = (s: S, e: HandoffEvent) => StepResult<S>;

function _abort(s: S, reason: AbortReason, notify: boolean): StepResult<S> {
  const actions: HandoffAction[] = [];
  if (notify && s.handoffId !== null) {
    actions.push({
      type: "send",
      msg: { type: "AbortNotice", handoffId: s.handoffId, attempt: s.attempt, reason },
    });
  }
  if (s.phase !== Phase.Idle) actions.push({ type: "release" });
  const next: S = { ...s, phase: Phase.Failed, manifest: null, outcome: { reason } };
  return { state: next, actions };
}

function _protocolError(s: S, e: HandoffEvent, detail: string): StepResult<S> {
  return { ..._abort(s, "protocol-error", true), rejected: rejectEvent(s, e, detail).rejected };
}

type Outgoing<M> = M extends HandoffMessage ? Omit<M, "handoffId" | "attempt"> : never;

function _send(s: S, msg: Outgoing<HandoffMessage>): HandoffAction {
  return {
    type: "send",
    msg: { ...msg, handoffId: s.handoffId!, attempt: s.attempt } as HandoffMessage,
  };
}

const onReserveRequest: Handler = (s, e) => {
  if (e.type !== "ReserveRequest" || typeof e.handoffId !== "string" || !isCount(e.attempt)) {
    return rejectEvent(s, e, "malformed reservation request"); // no session opened yet
  }
  const next: S = { ...s, phase: Phase.Reserving, handoffId: e.handoffId, attempt: e.attempt };
  return { state: next, actions: [{ type: "reserve", request: e }] };
};

const onReserved: Handler = (s, e) => {
  const keyOk = e.type === "Reserved" && e.bindingKey instanceof Uint8Array &&
    e.bindingKey.length === BINDING_KEY_BYTES;
  const parityOk = e.type === "Reserved" &&
    (e.parity === undefined || e.parity === "bitwise" || e.parity === "not-claimed");
  if (e.type !== "Reserved" || !keyOk || !parityOk || !isCount(e.creditBytes)) {
    return _protocolError(s, e, "malformed reservation result");
  }
  const msg = {
    type: "ReserveAccepted" as const,
    creditBytes: e.creditBytes,
    bindingKey: e.bindingKey,
  };
  const next: S = { ...s, phase: Phase.Streaming, probeCompared: e.parity !== "not-claimed" };
  return { state: next, actions: [_send(s, msg)] };
};

const onStateChunk: Handler = (s, e) => {
  if (e.type !== "StateChunk" || typeof e.header !== "object" || e.header === null) {
    return _protocolError(s, e, "malformed chunk");
  }
  if (s.manifest) return _protocolError(s, e, "chunk after the final manifest");
  const next: S = { ...s, stagesInFlight: s.stagesInFlight + 1 };
  return { state: next, actions: [{ type: "stage", header: e.header }] };
};

const onChunkStaged: Handler = (s, e) => {
  if (e.type !== "ChunkStaged" || !isCount(e.creditBytes) || s.stagesInFlight === 0) {
    return _protocolError(s, e, "stage result without a stage in flight");
  }
  // Progress renews the reservation: `reservationMs` bounds a stall, never a long prompt.
  const next: S = { ...s, stagesInFlight: s.stagesInFlight - 1, reservedMs: 0 };
  const actions: HandoffAction[] = [];
  if (e.creditBytes > 0 && next.manifest === null) {
    actions.push(_send(s, { type: "TransferCredit", creditBytes: e.creditBytes }));
  }
  return next.stagesInFlight === 0 && next.manifest
    ? _startVerify(next, actions)
    : { state: next, actions };
};

const onFinalManifest: Handler = (s, e) => {
  if (e.type !== "FinalManifest" || !_manifestShapeOk(s, e.manifest)) {
    return _protocolError(s, e, "malformed manifest");
  }
  if (s.manifest) return _protocolError(s, e, "second manifest");
  const next: S = { ...s, manifest: e.manifest };
  return s.stagesInFlight === 0 ? _startVerify(next, []) : { state: next, actions: [] };
};

// Only what this table reads; the full check is `validateManifest` in the verify action.
function _manifestShapeOk(s: S, m: unknown): m is FinalManifest {
  const x = m as FinalManifest | null;
  return typeof x === "object" && x !== null && x.handoffId === s.handoffId &&
    Array.isArray(x.verify) && typeof x.logical === "object" && x.logical !== null &&
    isCount(x.logical.position);
}

function _startVerify(s: S, actions: HandoffAction[]): StepResult<S> {
  const manifest = s.manifest!;
  actions.push({ type: "verify", manifest });
  return { state: { ...s, phase: Phase.Validating }, actions };
}

const onVerified: Handler = (s) => ({
  state: { ...s, phase: Phase.Importing },
  actions: [{ type: "import" }],
});

const onImported: Handler = (s) => ({
  state: { ...s, phase: Phase.Probing },
  actions: [{ type: "probe", steps: [...s.manifest!.verify] }],
});

const onProbeDone: Handler = (s, e) => {
  if (e.type !== "ProbeDone" || !isHex(e.logitsSha256, SHA256_BYTES)) {
    return _protocolError(s, e, "malformed probe result");
  }
  if (s.ownProbe !== null) return _protocolError(s, e, "second probe result");
  return _settleProbe({ ...s, ownProbe: e.logitsSha256 });
};

const onProbeDigest: Handler = (s, e) => {
  if (e.type !== "ProbeDigest" || !isHex(e.logitsSha256, SHA256_BYTES)) {
    return _protocolError(s, e, "malformed probe digest");
  }
  if (s.manifest?.probe?.logitsSha256 !== null) {
    return _protocolError(s, e, "probe digest the manifest did not announce");
  }
  if (s.peerProbe !== null) return _protocolError(s, e, "second probe digest");
  const next: S = { ...s, peerProbe: e.logitsSha256 };
  return s.phase === Phase.Probing ? _settleProbe(next) : { state: next, actions: [] };
};

/**
 * Commits once the decoder's own digest and the prefiller's are both known and equal; waits
 * (bounded by `reservationMs`) while the prefiller's is still on its way.
 */
function _settleProbe(s: S): StepResult<S> {
  if (s.ownProbe === null) return { state: s, actions: [] };
  const probe = s.manifest!.probe;
  const want = probe === undefined || !s.probeCompared
    ? s.ownProbe
    : probe.logitsSha256 ?? s.peerProbe;
  if (want === null) return { state: s, actions: [] };
  if (want !== s.ownProbe) return _abort(s, "probe-failed", true);
  const position = s.manifest!.logical.position;
  const next: S = { ...s, phase: Phase.Committed, position };
  // CommitAck first: the prefiller may release only once the decoder owns the state.
  return {
    state: next,
    actions: [_send(s, { type: "CommitAck", position }), { type: "allow-generate" }],
  };
}

/** After commit without comparing digests: the prefiller's digest may still arrive. */
const onDigestAfterCommit: Handler = (s, e) => {
  const ok = e.type === "ProbeDigest" && isHex(e.logitsSha256, SHA256_BYTES);
  if (s.probeCompared || e.type !== "ProbeDigest" || !ok || s.peerProbe !== null) {
    return rejectEvent(s, e, "probe digest after commit");
  }
  return { state: { ...s, peerProbe: e.logitsSha256 }, actions: [] };
};

const onStepFailed: Handler = (s, e) => {
  const reason = "reason" in e && isAbortReason(e.reason) ? e.reason : "protocol-error";
  return _abort(s, reason, true);
};

const onPeerAbort: Handler = (s, e) => {
  const reason = e.type === "AbortNotice" && isAbortReason(e.reason) ? e.reason : "protocol-error";
  if (s.phase !== Phase.Committed) return _abort(s, reason, false);
  // The coordinator never moved affinity here (it saw no CommitAck): drop the session.
  const next: S = { ...s, phase: Phase.Released, outcome: { reason } };
  return { state: next, actions: [{ type: "stop-generate" }, { type: "release" }] };
};

const onConnectionLost: Handler = (s) => {
  // After commit, decoding is local: the prefiller's connection is no longer needed.
  if (s.phase === Phase.Committed) return { state: s, actions: [] };
  return _abort(s, "connection-lost", false);
};

const onCancel: Handler = (s) => {
  if (s.phase !== Phase.Committed) return _abort(s, "cancelled", true);
  const next: S = { ...s, phase: Phase.Released, outcome: { reason: "cancelled" } };
  return { state: next, actions: [{ type: "stop-generate" }, { type: "release" }] };
};

const onSessionEnded: Handler = (s) => ({
  state: { ...s, phase: Phase.Released },
  actions: [{ type: "release" }],
});

const onTick: Handler = (s, e) => {
  if (e.type !== "Tick" || !Number.isFinite(e.elapsedMs) || e.elapsedMs < 0) {
    return rejectEvent(s, e, "elapsedMs must be a finite, non-negative duration");
  }
  const running = s.phase > Phase.Idle && s.phase < Phase.Committed;
  if (!running) return { state: s, actions: [] };
  const next: S = { ...s, reservedMs: s.reservedMs + e.elapsedMs };
  if (next.reservedMs > s.timing.reservationMs) return _abort(next, "reservation-expired", true);
  return { state: next, actions: [] };
};

const FAILURES = {
  AbortNotice: onPeerAbort,
  ConnectionLost: onConnectionLost,
  Cancel: onCancel,
} satisfies Partial<Record<HandoffEventType, Handler>>;

/**
 * The decoder's transition table: phase -> event -> handler. Unlisted pairs are protocol
 * errors; Tick is valid everywhere. `allow-generate` appears in exactly one cell.
 */
export const DECODER_TABLE: Readonly<
  Partial<Record<PhaseName, Partial<Record<HandoffEventType, Handler>>>>
> = {
  Idle: { ReserveRequest: onReserveRequest },
  Reserving: { Reserved: onReserved, ReserveFailed: onStepFailed, ...FAILURES },
  Streaming: {
    StateChunk: onStateChunk,
    ChunkStaged: onChunkStaged,
    ChunkRejected: onStepFailed,
    FinalManifest: onFinalManifest,
    ProbeDigest: onProbeDigest,
    ...FAILURES,
  },
  // From here the handoff stream may still carry the probe digest: its reader can still fail.
  Validating: {
    Verified: onVerified,
    VerifyFailed: onStepFailed,
    ChunkRejected: onStepFailed,
    ProbeDigest: onProbeDigest,
    ...FAILURES,
  },
  Importing: {
    Imported: onImported,
    ImportFailed: onStepFailed,
    ChunkRejected: onStepFailed,
    ProbeDigest: onProbeDigest,
    ...FAILURES,
  },
  Probing: {
    ProbeDone: onProbeDone,
    ProbeFailed: onStepFailed,
    ProbeDigest: onProbeDigest,
    ChunkRejected: onStepFailed,
    ...FAILURES,
  },
  Committed: { SessionEnded: onSessionEnded, ProbeDigest: onDigestAfterCommit, ...FAILURES },
};

/**
 * One pure transition of the decoder. Never throws. Between reservation and commit, an event
 * not valid in the phase fails the session closed (AbortNotice "protocol-error", release); in
 * Idle, Committed and terminal phases it is only rejected, so a stray or replayed message can
 * neither open nor disturb a session.
 *
 * @example
 * ```ts
 * const { state, actions } = decoderStep(d, { type: "ProbeDone", logitsSha256 });
 * // actions: send CommitAck, allow-generate
 * ```
 */
export function decoderStep(s: S, e: HandoffEvent): StepResult<S> {
  if (typeof e !== "object" || e === null) {
    return rejectEvent(s, { type: String(e) }, "not an event");
  }
  if (e.type === "Tick") return onTick(s, e);
  if (
    isMessage(e) && s.phase !== Phase.Idle &&
    (e.handoffId !== s.handoffId || e.attempt !== s.attempt)
  ) {
    return rejectEvent(s, e, "stray message of another handoff or attempt");
  }
  if (isTerminal(s.phase)) return rejectEvent(s, e, "the handoff is over");
  // Own keys only: a peer's type "constructor" or "__proto__" must not reach Object.prototype.
  const row = DECODER_TABLE[phaseName(s.phase)];
  const handler = row && Object.hasOwn(row, e.type) ? row[e.type] : undefined;
  if (handler) return handler(s, e);
  if (s.phase === Phase.Idle) return rejectEvent(s, e, "no reservation yet");
  if (s.phase === Phase.Committed) return rejectEvent(s, e, "the session is committed");
  return _protocolError(s, e, "not valid in this phase");
}
