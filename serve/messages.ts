/**
 * Application messages between a coordinator and the workers, on the control stream, named by
 * direction. The two-phase handoff's own messages (ReserveRequest ... AbortNotice) are defined
 * in core/handoff.ts; these carry the request around them.
 *
 * Every message received is checked by `parseMessage` before use: unknown types and malformed
 * fields are a ProtocolError that says which field was wrong (never its content).
 */
import { type AbortReason, isAbortReason, ProtocolError } from "../core/mod.ts";
import type { DecoderTelemetrySummary, PrefillerTelemetrySummary } from "../core/telemetry.ts";

/**
 * Every bound on the request path is sized so that no valid request reaches it: results and
 * telemetry are fixed-size, tokens stream in bounded batches, and the prompt bound is sized
 * from tokens (PROMPT_TOKENS_MAX tokens of up to PROMPT_BYTES_PER_TOKEN_MAX bytes each).
 */
/** Longest prompt, in tokens, the request path is sized for. */
export const PROMPT_TOKENS_MAX = 262_144;
/**
 * Bytes of UTF-8 text one prompt token may stand for, on average over the prompt. English
 * text averages about 4; 64 leaves room for long whitespace, code and non-Latin pieces.
 */
export const PROMPT_BYTES_PER_TOKEN_MAX = 64;
/** Largest prompt a request may carry, in bytes of UTF-8 (it travels as a frame payload). */
export const PROMPT_BYTES_MAX = PROMPT_TOKENS_MAX * PROMPT_BYTES_PER_TOKEN_MAX;
/** Control frames: small headers (fixed-size messages), payloads up to a prompt. */
export const CONTROL_FRAME_LIMITS = {
  headerBytesMax: 64 * 1024,
  payloadBytesMax: PROMPT_BYTES_MAX,
};
/** Largest number of tokens one request may ask to generate. */
export const GENERATE_TOKENS_MAX = 1 << 20;
/** Tokens in one TokenBatch message. */
export const TOKEN_BATCH_TOKENS_MAX = 16;
/**
 * A TokenBatch is sent once its text reaches this many bytes, so its text stays under this
 * plus one token's piece (vocabulary pieces are far shorter than the header bound).
 */
export const TOKEN_BATCH_TEXT_BYTES_MAX = 16 * 1024;
/** Tokens a client may say it already has (the first token, streamed by the prefiller). */
export const SENT_TOKENS_MAX = 1;

export interface SamplingSpec {
  temperature: number;
  topK: number;
  topP: number;
  seed: number;
}

/** Where a peer listens, and which node must answer there. */
export interface PeerAddress {
  host: string;
  port: number;
  /** Node id expected at that address (its certificate pin comes from the trust list). */
  nodeId: string;
}

/** Coordinator -> prefill worker: prefill this prompt and hand the state to `decode`. */
export interface PrefillRequest {
  type: "PrefillRequest";
  handoffId: string;
  tenantId: string;
  prompt: string;
  /** Tokens the decoder will generate (sizes the decoder's context). */
  generateTokens: number;
  sampling: SamplingSpec;
  decode: PeerAddress;
  /** Return the SHA-256 of the prompt's last logits (probe mode). */
  probe: boolean;
}

/** Coordinator -> prefill worker: stop this handoff (the client went away or gave up). */
export interface CancelRequest {
  type: "CancelRequest";
  handoffId: string;
}

/** Prefill worker -> coordinator: how the handoff ended. */
export interface PrefillOutcome {
  type: "PrefillOutcome";
  handoffId: string;
  outcome: "committed" | "fallback" | "failed";
  reason: AbortReason | null;
  /** One line for the user when not committed (no content). */
  message: string | null;
  promptTokens: number;
  /** Fixed-size telemetry of the prefill side (null when the handoff never started). */
  telemetry: PrefillerTelemetrySummary | null;
}

/**
 * Prefill worker -> coordinator: the first generated token, sent the moment prefill ends (the
 * prefiller samples it), before the rest of the state is exported, so the client's first token
 * does not wait for the handoff. Whatever continues the request continues after it.
 */
export interface FirstToken {
  type: "FirstToken";
  handoffId: string;
  token: number;
  /** Its text (empty when the piece is an incomplete UTF-8 sequence). */
  text: string;
  /** With `probe`: SHA-256 (hex) of the logits it was sampled from. */
  logitsSha256: string | null;
  /** Prefiller's clock: end of prefill to this message being sent. */
  sentAfterPrefillMs: number;
  /** Prefiller's wall clock at the end of prefill (ms since the epoch; same-host telemetry). */
  prefillEndEpochMs: number;
}

/**
 * Worker -> coordinator: the request is progressing (`done` counts work units: positions the
 * worker's context holds). Sent at most once per PROGRESS_INTERVAL_MS, only when `done` moved,
 * so a coordinator's idle timeout measures progress, not time.
 */
export interface Progress {
  type: "Progress";
  handoffId: string;
  done: number;
}

/** How often a working worker reports Progress. */
export const PROGRESS_INTERVAL_MS = 1_000;

/** Coordinator -> decode worker: generate for a committed handoff, or colocated from a prompt. */
export interface GenerateRequest {
  type: "GenerateRequest";
  handoffId: string;
  tenantId: string;
  generateTokens: number;
  /** `committed`: continue the imported session. `local`: prefill `prompt` here (fallback). */
  mode: "committed" | "local";
  prompt: string | null;
  sampling: SamplingSpec | null;
  /** Return the SHA-256 of every step's logits (probe mode). */
  probe: boolean;
  /**
   * Tokens the client already has (the prefiller's FirstToken): the decoder generates them
   * again, checks they are equal, and streams from the next one. Absent: none.
   */
  sentTokens?: number[];
}

/** Decode worker -> coordinator: generated tokens, in order. */
export interface TokenBatch {
  type: "TokenBatch";
  handoffId: string;
  tokens: number[];
  text: string;
  /** With `probe`: SHA-256 (hex) of the logits each token was sampled from. */
  logitsSha256: string[];
}

/** Decode worker -> coordinator: generation finished (or failed). */
export interface GenerateDone {
  type: "GenerateDone";
  handoffId: string;
  ok: boolean;
  message: string | null;
  /** Fixed-size telemetry of the decode side (null when generation never started). */
  telemetry: DecoderTelemetrySummary | null;
  /** Whether the MTP draft state was imported and ready (null: the model has no MTP). */
  mtpReady: boolean | null;
  /**
   * Which decode path served the request: a context of its own (`per-session`) or a sequence
   * of the continuously batched shared context (`batched`). Absent from older workers.
   */
  decodePath?: "per-session" | "batched";
  /** True when the request was refused by admission (no session free in time): retry or fall back. */
  busy?: boolean;
}

/** Anyone trusted -> worker: report what you hold right now (counts only, no content). */
export interface StatsRequest {
  type: "StatsRequest";
  /** Echoed in the answer. */
  requestId: string;
}

/** What a worker holds: every count returns to zero once its handoffs have ended. */
export interface WorkerCounters {
  /** Prefill side: handoffs running, and bytes of exported state retained for them. */
  prefillActive: number;
  retainedBytes: number;
  /** Decode side: uncommitted attempts, and bytes of state staged for them. */
  decodeAttempts: number;
  stagedBytes: number;
  /** Committed sessions waiting for their GenerateRequest, and generations running. */
  committedSessions: number;
  generating: number;
  /** Contexts taken from the pool (at most sessionsMax). */
  contextsBusy: number;
  /** Since start: reservations accepted, and attempts committed or aborted. */
  reservationsTotal: number;
  commitsTotal: number;
  abortsTotal: number;
  /** The worker's resident set size (bytes), `Deno.memoryUsage().rss`. */
  rssBytes?: number;
  /** Decode side: which path serves requests (see GenerateDone's `decodePath`). */
  decodePath?: "per-session" | "batched";
  /** Batched decode side: sequences of the shared context, and KV cells, in use and in all. */
  sequencesBusy?: number;
  sequencesMax?: number;
  kvCellsUsed?: number;
  kvCellsMax?: number;
  /** Recurrent slots in use (one per sequence; 0 for a model without recurrent layers). */
  recurrentSlotsBusy?: number;
  /** Sequences out of service (llama.cpp would not remove their state; never handed out). */
  sequencesOutOfService?: number;
  /** Admission: requests waiting for a session now; admitted, queued and refused since start. */
  admissionWaiting?: number;
  admittedTotal?: number;
  queuedTotal?: number;
  refusedBusyTotal?: number;
}

/** Worker -> requester: the answer to StatsRequest. */
export interface WorkerStats extends WorkerCounters {
  type: "WorkerStats";
  requestId: string;
}

export type ServeMessage =
  | PrefillRequest
  | CancelRequest
  | PrefillOutcome
  | FirstToken
  | Progress
  | GenerateRequest
  | TokenBatch
  | GenerateDone
  | StatsRequest
  | WorkerStats;

type Checker = (m: Record<string, unknown>) => string | null;

const str = (v: unknown, max = 256) => typeof v === "string" && v.length > 0 && v.length <= max;
const count = (v: unknown, max = Number.MAX_SAFE_INTEGER) =>
  Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= max;
const num = (v: unknown) => typeof v === "number" && Number.isFinite(v);
const objectOrNull = (v: unknown) => v === null || (typeof v === "object" && !Array.isArray(v));
const hex64 = (v: unknown) => typeof v === "string" && /^[0-9a-f]{64}$/.test(v);

function samplingOk(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const s = v as Record<string, unknown>;
  return num(s.temperature) && (s.temperature as number) >= 0 && count(s.topK) &&
    num(s.topP) && count(s.seed, 0xffffffff);
}

function addressOk(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const a = v as Record<string, unknown>;
  return str(a.host) && count(a.port, 65535) && str(a.nodeId, 64);
}

const CHECKS: Record<ServeMessage["type"], Checker> = {
  PrefillRequest: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : !str(m.tenantId, 128)
      ? "tenantId"
      : typeof m.prompt !== "string" || new TextEncoder().encode(m.prompt).length > PROMPT_BYTES_MAX
      ? "prompt"
      : !count(m.generateTokens, GENERATE_TOKENS_MAX)
      ? "generateTokens"
      : !samplingOk(m.sampling)
      ? "sampling"
      : !addressOk(m.decode)
      ? "decode"
      : null,
  CancelRequest: (m) => !str(m.handoffId, 64) ? "handoffId" : null,
  PrefillOutcome: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : !["committed", "fallback", "failed"].includes(m.outcome as string)
      ? "outcome"
      : m.reason !== null && !isAbortReason(m.reason)
      ? "reason"
      : !objectOrNull(m.telemetry)
      ? "telemetry"
      : null,
  FirstToken: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : !count(m.token, 0x7fffffff)
      ? "token"
      : typeof m.text !== "string" || m.text.length > TOKEN_BATCH_TEXT_BYTES_MAX
      ? "text"
      : m.logitsSha256 !== null && !hex64(m.logitsSha256)
      ? "logitsSha256"
      : !num(m.sentAfterPrefillMs)
      ? "sentAfterPrefillMs"
      : !num(m.prefillEndEpochMs)
      ? "prefillEndEpochMs"
      : null,
  Progress: (m) => !str(m.handoffId, 64) ? "handoffId" : !count(m.done) ? "done" : null,
  GenerateRequest: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : !str(m.tenantId, 128)
      ? "tenantId"
      : !count(m.generateTokens, GENERATE_TOKENS_MAX)
      ? "generateTokens"
      : !["committed", "local"].includes(m.mode as string)
      ? "mode"
      : m.mode === "local" && (typeof m.prompt !== "string" || !samplingOk(m.sampling))
      ? "prompt"
      : m.sentTokens !== undefined && (!Array.isArray(m.sentTokens) ||
          m.sentTokens.length > SENT_TOKENS_MAX || !m.sentTokens.every((t) => count(t, 0x7fffffff)))
      ? "sentTokens"
      : null,
  TokenBatch: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : !Array.isArray(m.tokens) || m.tokens.length > TOKEN_BATCH_TOKENS_MAX ||
          !m.tokens.every((t) => count(t, 0x7fffffff))
      ? "tokens"
      : typeof m.text !== "string"
      ? "text"
      : !Array.isArray(m.logitsSha256) || m.logitsSha256.length > m.tokens.length ||
          !m.logitsSha256.every(hex64)
      ? "logitsSha256"
      : null,
  GenerateDone: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : typeof m.ok !== "boolean"
      ? "ok"
      : !objectOrNull(m.telemetry)
      ? "telemetry"
      : null,
  StatsRequest: (m) => !str(m.requestId, 64) ? "requestId" : null,
  WorkerStats: (m) =>
    !str(m.requestId, 64) ? "requestId" : COUNTER_FIELDS.find((f) => !count(m[f])) ?? null,
};

/** The fields of WorkerCounters, for checks and for summing. */
export const COUNTER_FIELDS: readonly (keyof WorkerCounters)[] = [
  "prefillActive",
  "retainedBytes",
  "decodeAttempts",
  "stagedBytes",
  "committedSessions",
  "generating",
  "contextsBusy",
  "reservationsTotal",
  "commitsTotal",
  "abortsTotal",
];

const ABORT_TEXT: Partial<Record<AbortReason, string>> = {
  "identity-mismatch": "the decode worker's numerical identity differs from this worker's",
  "capability-missing": "the decode worker lacks the capabilities for this handoff",
  "connection-lost": "the connection to the decode worker was lost",
  "commit-timeout": "the decode worker did not acknowledge the commit in time",
  "lease-expired": "the retained state's lease expired before the commit",
  "probe-failed": "the decode worker's continuation probe did not match",
  "cancelled": "the request was cancelled",
  "reserve-timeout": "the decode worker did not answer the reservation in time",
  "reserve-rejected": "the decode worker refused the reservation (busy, or a replay)",
  "binding-tag": "the decode worker rejected state bound to another handoff, tenant or worker",
  "invalid-state": "the decode worker rejected the state as invalid",
  "protocol-error": "the handoff broke protocol (see both workers' logs)",
};

/** A one-line description of an abort reason for PrefillOutcome.message (no content). */
export function describeAbort(reason: AbortReason): string {
  return ABORT_TEXT[reason] ?? `handoff aborted: ${isAbortReason(reason) ? reason : "unknown"}`;
}

/** True when `type` is one of this file's message types. */
export function isServeMessageType(type: string): type is ServeMessage["type"] {
  return Object.hasOwn(CHECKS, type);
}

/** Checks a received control header as message `type`; throws ProtocolError naming the field. */
export function parseMessage<T extends ServeMessage>(header: Record<string, unknown>): T {
  const type = header.type;
  if (typeof type !== "string" || !isServeMessageType(type)) {
    throw new ProtocolError(`Unexpected control message type "${String(type).slice(0, 40)}"`);
  }
  const bad = CHECKS[type](header);
  if (bad) throw new ProtocolError(`Malformed ${type}: field "${bad}" is missing or invalid`);
  return header as unknown as T;
}
