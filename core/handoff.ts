/**
 * The two-phase handoff as data: ordered phases, messages named by direction, events, actions
 * and timing options shared by the prefiller's and the decoder's transition tables
 * (`handoff_prefiller.ts`, `handoff_decoder.ts`). Each role has a pure
 * `step(state, event) -> { state, actions }`; an I/O loop elsewhere carries out the actions and
 * feeds back their results as events. Deadlines are durations advanced by `Tick` events, never
 * clock readings sent between processes.
 *
 * Ownership: the prefiller keeps its exported state until CommitAck, abort or lease expiry
 * (`erase-retained` ends it). The decoder holds staged state uncommitted until the probe
 * passes; only then does an `allow-generate` action appear.
 *
 * @module
 */
import type { ChunkHeader } from "./chunk.ts";
import { type ProtocolError, UsageError } from "./errors.ts";
import type { FinalManifest, VerifyStep } from "./manifest.ts";
import type { ModelFamily } from "./schema.ts";

/**
 * Phases, ordered so that "least advanced" is `Math.min` (as SGLang's KVPoll). The prefiller
 * visits Idle, Reserving, Streaming, Validating (waiting for CommitAck) and Released; the
 * decoder visits every phase.
 */
export const Phase = {
  Failed: 0,
  Idle: 1,
  Reserving: 2,
  Streaming: 3,
  Validating: 4,
  Importing: 5,
  Probing: 6,
  Committed: 7,
  Released: 8,
} as const;
export type Phase = typeof Phase[keyof typeof Phase];
export type PhaseName = keyof typeof Phase;

const PHASE_NAMES = Object.fromEntries(Object.entries(Phase).map(([k, v]) => [v, k])) as Record<
  Phase,
  PhaseName
>;

/** The name of a phase, for messages and telemetry. */
export function phaseName(p: Phase): PhaseName {
  return PHASE_NAMES[p];
}

/**
 * The least advanced of several phases (Failed wins): how a coordinator summarises a set.
 *
 * @example
 * ```ts
 * leastAdvanced([Phase.Committed, Phase.Streaming]); // Phase.Streaming
 * ```
 */
export function leastAdvanced(phases: readonly Phase[]): Phase {
  return phases.length === 0 ? Phase.Idle : Math.min(...phases) as Phase;
}

/** True for phases no event moves out of. */
export function isTerminal(p: Phase): boolean {
  return p === Phase.Failed || p === Phase.Released;
}

/** Machine-readable reasons carried by AbortNotice and by failure actions. */
export const ABORT_REASONS = [
  "reserve-timeout",
  "reserve-rejected",
  "identity-mismatch",
  "capability-missing",
  "invalid-state",
  "binding-tag",
  "credit-exceeded",
  "credit-stall",
  "import-failed",
  "probe-failed",
  "commit-timeout",
  "lease-expired",
  "reservation-expired",
  "connection-lost",
  "cancelled",
  "export-failed",
  "protocol-error",
] as const;
export type AbortReason = typeof ABORT_REASONS[number];

/** Type guard for reasons received from a peer. */
export function isAbortReason(x: unknown): x is AbortReason {
  return typeof x === "string" && (ABORT_REASONS as readonly string[]).includes(x);
}

// ---- Messages, named by direction -------------------------------------------------------

/** Coordinator/prefiller -> decoder: reserve an uncommitted session for this handoff. */
export interface ReserveRequest {
  type: "ReserveRequest";
  handoffId: string;
  /** 0 for the first try; each retry is a fresh reservation with a fresh binding key. */
  attempt: number;
  tenantId: string;
  sourceNodeId: string;
  destNodeId: string;
  identityDigest: string;
  schemaVersion: number;
  family: ModelFamily;
  promptTokens: number;
  /** Estimated total state bytes, so the decoder can refuse what will not fit. */
  stateBytesEstimate: number;
  /** Context the decoder must have (see `contextTokensNeeded`). */
  contextTokensNeeded: number;
}

/** Decoder -> prefiller: reservation made; initial credit and the binding key. */
export interface ReserveAccepted {
  type: "ReserveAccepted";
  handoffId: string;
  attempt: number;
  creditBytes: number;
  /** 32 random bytes; sent only over the encrypted, authenticated channel. */
  bindingKey: Uint8Array;
}

/** Decoder -> prefiller: more bytes may be sent (staged bytes were imported). */
export interface TransferCredit {
  type: "TransferCredit";
  handoffId: string;
  attempt: number;
  creditBytes: number;
}

/** Prefiller -> decoder: one chunk header; payload and binding tag travel in the same frame. */
export interface StateChunk {
  type: "StateChunk";
  handoffId: string;
  attempt: number;
  header: ChunkHeader;
}

/** Prefiller -> decoder: the complete, tagged component list. */
export interface FinalManifestMessage {
  type: "FinalManifest";
  handoffId: string;
  attempt: number;
  manifest: FinalManifest;
}

/**
 * Prefiller -> decoder: the continuation probe's logits digest, when the manifest said it
 * follows (`probe.logitsSha256: null`). It travels after the manifest, so the prefiller's own
 * probe decode overlaps the decoder's import and probe instead of delaying the manifest. The
 * tag is a binding tag (domain "probe-digest") the decoder checks before this reaches its
 * table; it commits only once its own digest equals this one.
 */
export interface ProbeDigestMessage {
  type: "ProbeDigest";
  handoffId: string;
  attempt: number;
  /** SHA-256 (hex) of the prefiller's probe logits. Never printed. */
  logitsSha256: string;
  tag: string;
}

/** Decoder -> prefiller: state committed; the decoder owns the request from now. */
export interface CommitAck {
  type: "CommitAck";
  handoffId: string;
  attempt: number;
  /** The position the decoder continues from (n_past); no token values. */
  position: number;
}

/** Either way: the handoff attempt is over, with a machine-readable reason. */
export interface AbortNotice {
  type: "AbortNotice";
  handoffId: string;
  attempt: number;
  reason: AbortReason;
}

export type HandoffMessage =
  | ReserveRequest
  | ReserveAccepted
  | TransferCredit
  | StateChunk
  | FinalManifestMessage
  | ProbeDigestMessage
  | CommitAck
  | AbortNotice;

// ---- Local events (results of actions, timers, the outside world) ------------------------

/** Prefiller: begin (send the reservation). */
export interface StartEvent {
  type: "Start";
}
/** Prefiller: the exporter produced a chunk ready to send. */
export interface ChunkReadyEvent {
  type: "ChunkReady";
  header: ChunkHeader;
}
/** Prefiller: export finished; the signed manifest is ready. */
export interface ExportDoneEvent {
  type: "ExportDone";
  manifest: FinalManifest;
}
/** Prefiller: its probe decode finished after the manifest was built; the signed digest. */
export interface ProbeReadyEvent {
  type: "ProbeReady";
  logitsSha256: string;
  tag: string;
}
/** Prefiller: prefill or export failed locally. */
export interface ExportFailedEvent {
  type: "ExportFailed";
}
/** Decoder: the `reserve` action succeeded. */
export interface ReservedEvent {
  type: "Reserved";
  creditBytes: number;
  bindingKey: Uint8Array;
  /**
   * The reservation's parity verdict (serve/_reservation.ts). Only where bitwise parity is
   * claimed must the decoder's probe digest equal the prefiller's; where it is not (a
   * parity-only identity field differs, or is unknown: another device of the same backend,
   * whose kernels may round differently), the handoff was accepted on the must-match fields
   * and commits on the decoder's own probe. Absent: "bitwise".
   */
  parity?: "bitwise" | "not-claimed";
}
/** Decoder: a local step failed (reserve, stage, verify, import, probe), with its reason. */
export interface StepFailedEvent {
  type: "ReserveFailed" | "ChunkRejected" | "VerifyFailed" | "ImportFailed" | "ProbeFailed";
  reason: AbortReason;
}
/** Decoder: a `stage` action finished; `creditBytes` may be returned to the prefiller. */
export interface ChunkStagedEvent {
  type: "ChunkStaged";
  creditBytes: number;
}
/** Decoder: `verify` or `import` succeeded; or the committed session ended. */
export interface DoneEvent {
  type: "Verified" | "Imported" | "SessionEnded";
}
/**
 * Decoder: its own probe decode ran; the digest of its logits. The table compares it with the
 * prefiller's (inline in the manifest, or from ProbeDigest) and commits only if they match.
 */
export interface ProbeDoneEvent {
  type: "ProbeDone";
  logitsSha256: string;
}
/** Either role: the peer connection is gone, or the local side cancels. */
export interface LinkEvent {
  type: "ConnectionLost" | "Cancel";
}
/** Either role: `elapsedMs` of local monotonic time passed since the previous Tick. */
export interface TickEvent {
  type: "Tick";
  elapsedMs: number;
}

export type LocalEvent =
  | StartEvent
  | ChunkReadyEvent
  | ExportDoneEvent
  | ProbeReadyEvent
  | ExportFailedEvent
  | ReservedEvent
  | StepFailedEvent
  | ChunkStagedEvent
  | DoneEvent
  | ProbeDoneEvent
  | LinkEvent
  | TickEvent;

export type HandoffEvent = HandoffMessage | LocalEvent;
export type HandoffEventType = HandoffEvent["type"];

/** Every event type, for exhaustive tests and tables. */
export const EVENT_TYPES: readonly HandoffEventType[] = [
  "ReserveRequest",
  "ReserveAccepted",
  "TransferCredit",
  "StateChunk",
  "FinalManifest",
  "ProbeDigest",
  "CommitAck",
  "AbortNotice",
  "Start",
  "ChunkReady",
  "ExportDone",
  "ProbeReady",
  "ExportFailed",
  "Reserved",
  "ReserveFailed",
  "ChunkStaged",
  "ChunkRejected",
  "Verified",
  "VerifyFailed",
  "Imported",
  "ImportFailed",
  "ProbeDone",
  "ProbeFailed",
  "SessionEnded",
  "ConnectionLost",
  "Cancel",
  "Tick",
];

// ---- Actions ------------------------------------------------------------------------------

/** What the I/O loop must do. Results come back as events. */
export type HandoffAction =
  | { type: "send"; msg: HandoffMessage }
  /** Prefiller: tag every following chunk and the manifest with this key. */
  | { type: "bind"; bindingKey: Uint8Array }
  /** Prefiller: re-send every retained chunk from seq 0 under the new reservation. */
  | { type: "retry"; attempt: number; reason: AbortReason }
  /** Decoder: check identity and memory, reserve a session, draw a binding key. */
  | { type: "reserve"; request: ReserveRequest }
  /** Decoder: ledger.accept + stage (KV pages are imported, uncommitted, as they arrive). */
  | { type: "stage"; header: ChunkHeader }
  /** Decoder: check the manifest tag and `ledger.verifyAgainst(manifest)`. */
  | { type: "verify"; manifest: FinalManifest }
  /** Decoder: import the staged snapshot components (recurrent, SWA, MTP, metadata). */
  | { type: "import" }
  /** Decoder: readiness checks plus the probes the manifest lists. */
  | { type: "probe"; steps: readonly VerifyStep[] }
  /** Decoder: the session may generate. Only ever emitted together with CommitAck. */
  | { type: "allow-generate" }
  | { type: "stop-generate" }
  /** Free the reservation, session or transport resources of this handoff. */
  | { type: "release" }
  /** Prefiller: erase the retained exported state. */
  | { type: "erase-retained" }
  /** Coordinator: move request affinity to the decoder (the handoff committed). */
  | { type: "committed"; position: number }
  /** Coordinator: recompute the prompt on the decoder (colocated placement). */
  | { type: "fallback"; reason: AbortReason }
  /** Coordinator: report an error to the client. */
  | { type: "fail"; reason: AbortReason };

/** What `step` returns. `rejected` is set when the event was not valid in that state. */
export interface StepResult<S> {
  state: S;
  actions: HandoffAction[];
  rejected?: ProtocolError;
}

// ---- Timing options -----------------------------------------------------------------------

/** Durations and retry bounds, each named with its unit last. */
export interface HandoffTiming {
  /** Prefiller: how long to wait for ReserveAccepted. */
  reserveTimeoutMs: number;
  /**
   * Prefiller: how long to wait for CommitAck after the manifest left (after the probe digest,
   * when it follows the manifest).
   */
  commitTimeoutMs: number;
  /** Prefiller: how long exported state is retained after the manifest first left. */
  leaseMs: number;
  /** Prefiller: how long one chunk may wait for credit before the decoder is deemed stalled. */
  creditStallMs: number;
  /**
   * Decoder: how long a reservation may stay uncommitted without a chunk staged (each staged
   * chunk renews it, so a long prefill that streams pages never hits it).
   */
  reservationMs: number;
  /** Prefiller: retries (fresh reservations) after the first attempt. */
  retriesMax: number;
}

export const DEFAULT_HANDOFF_TIMING: Readonly<HandoffTiming> = {
  reserveTimeoutMs: 2_000,
  commitTimeoutMs: 10_000,
  leaseMs: 30_000,
  creditStallMs: 10_000,
  reservationMs: 60_000,
  retriesMax: 2,
};

/**
 * Fills defaults and checks the timing fits together (the lease covers the commit wait).
 *
 * @example
 * ```ts
 * const timing = resolveHandoffTiming({ leaseMs: 5_000, commitTimeoutMs: 2_000 });
 * ```
 */
export function resolveHandoffTiming(partial: Partial<HandoffTiming> = {}): HandoffTiming {
  const t: HandoffTiming = { ...DEFAULT_HANDOFF_TIMING, ...partial };
  for (const [name, value] of Object.entries(t)) {
    const min = name === "retriesMax" ? 0 : 1;
    if (!Number.isSafeInteger(value) || value < min) {
      throw new UsageError(`Invalid handoff timing ${name} ${JSON.stringify(value)}`, {
        hint: "use a whole number of milliseconds (retriesMax: a count, 0 or more)",
      });
    }
  }
  if (t.leaseMs < t.commitTimeoutMs) {
    throw new UsageError(
      `Invalid handoff timing: leaseMs ${t.leaseMs} is shorter than commitTimeoutMs ${t.commitTimeoutMs}`,
      {
        hint: "the prefiller must retain its state at least as long as it waits for CommitAck",
      },
    );
  }
  return t;
}
