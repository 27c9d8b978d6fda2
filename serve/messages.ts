/**
 * Application messages between a coordinator and the workers, on the control stream, named by
 * direction. The two-phase handoff's own messages (ReserveRequest ... AbortNotice) are defined
 * in core/handoff.ts; these carry the request around them.
 *
 * Every message received is checked by `parseMessage` before use: unknown types and malformed
 * fields are a ProtocolError that says which field was wrong (never its content).
 */
import {
  type AbortReason,
  type CongestionControl,
  isAbortReason,
  ProtocolError,
} from "../core/mod.ts";
import type { DecoderTelemetrySummary, PrefillerTelemetrySummary } from "../core/telemetry.ts";
import type { SpeculationMode } from "../core/speculation.ts";
import type { TokenLogprob } from "../core/logprobs.ts";
import type { WorkerCounters } from "./worker_counters.ts";
import { MESSAGE_CHECKS } from "./_message_checks.ts";
export * from "./worker_counters.ts";
export * from "./message_bounds.ts";

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
  /** The chat template's special-token markers in `prompt` (see serve/prompt_tokens.ts). */
  promptSpecialSpans?: number[];
  /** With log probabilities: the FirstToken carries its own and this many alternatives. */
  logprobs?: number;
  /** Tokens the decoder will generate (sizes the decoder's context). */
  generateTokens: number;
  sampling: SamplingSpec;
  decode: PeerAddress;
  /** Return the SHA-256 of the prompt's last logits (probe mode). */
  probe: boolean;
  /**
   * If the decode worker is lost before CommitAck, complete the request here from the state
   * this worker still holds (PrefillOutcome `completedHere`, then TokenBatch and GenerateDone
   * as a decode worker sends them). Absent: report the loss and stop.
   */
  completeOnDecoderLoss?: boolean;
  /** UTF-16 offsets into `prompt` where a chat template's user turns end (prefix checkpoints). */
  turnEnds?: number[];
}

/**
 * Coordinator -> prefill worker: stop this handoff (the client went away or gave up). Only
 * the coordinator node that sent the PrefillRequest may cancel it, and only for its tenant.
 */
export interface CancelRequest {
  type: "CancelRequest";
  handoffId: string;
  /** The request's tenant; when given, a request of another tenant is left alone. */
  tenantId?: string;
}

/**
 * Prefill worker -> coordinator: how the handoff ended. `busy`: it never started, because
 * every context was prefilling and the queue was full or the wait too long (see
 * serve/prefill_queue.ts); the coordinator recomputes it colocated (a named fallback).
 */
export interface PrefillOutcome {
  type: "PrefillOutcome";
  handoffId: string;
  outcome: "committed" | "fallback" | "failed" | "busy";
  reason: AbortReason | null;
  /** One line for the user when not committed (no content). */
  message: string | null;
  promptTokens: number;
  /** Fixed-size telemetry of the prefill side (null when the handoff never started). */
  telemetry: PrefillerTelemetrySummary | null;
  /**
   * True: the decode worker was lost before the commit and this worker completes the request
   * itself (TokenBatch messages from the second token, then GenerateDone, follow).
   */
  completedHere?: boolean;
  /** The newest loss probe of the link to the decode worker (absent or null: none yet). */
  linkLoss?: LinkLossReport | null;
}

/**
 * The prefill worker's newest datagram loss probe of its link to the request's decode worker
 * (serve/link_loss.ts): `received` of `sent` arrived, in `lossEvents` runs of lost datagrams,
 * `ageMs` before the outcome was sent. `probe` names the probe (random), so one probe reported
 * twice counts once.
 */
export interface LinkLossReport {
  probe: number;
  sent: number;
  received: number;
  lossEvents: number;
  ageMs: number;
  /**
   * The controller the prefill worker sends to that decode worker with from now on (it may
   * change with the probe under `serve --congestion-control auto`); absent: Cubic.
   */
  congestionControl?: CongestionControl;
  /**
   * The bandwidth probe sent just before the loss probe: its bytes and their receive time in
   * ms (absent: none was due, or an older prefill worker). What the coordinator reads the
   * link's rate from while no handoff of the pair has given a sample.
   */
  bandwidthProbe?: { bytes: number; receiveMs: number };
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
  /** When the request asked for log probabilities. */
  logprob?: TokenLogprob;
}

/**
 * Worker -> coordinator: the request is progressing (`done` counts work units: positions the
 * worker's context holds). Sent at most once per PROGRESS_INTERVAL_MS, only when `done` moved,
 * so a coordinator's idle timeout measures progress, not time. The one exception: a request
 * waiting in the prefill worker's queue gets one per interval with `queued: true` and `done`
 * 0; that wait has its own bound (prefillQueueWaitMs), after which the answer is `busy`.
 */
export interface Progress {
  type: "Progress";
  handoffId: string;
  done: number;
  queued?: boolean;
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
  /** The chat template's special-token markers in `prompt` (see serve/prompt_tokens.ts). */
  promptSpecialSpans?: number[];
  sampling: SamplingSpec | null;
  /** Return the SHA-256 of every step's logits (probe mode). */
  probe: boolean;
  /**
   * Tokens the client already has (the prefiller's FirstToken, or all tokens streamed before a
   * resume): the worker generates them again, checks they are equal, and streams from the
   * next one. Absent: none. On the wire, more than SENT_TOKENS_HEADER_MAX travel in the
   * payload after the prompt (see `encodeRequestPayload`).
   */
  sentTokens?: number[];
  /**
   * `committed` mode: speculative decoding for this request, overriding the decode worker's
   * `--speculation` (its draft bounds stay the worker's). Absent: the worker's own.
   */
  speculation?: SpeculationMode;
  /** Log probabilities in each TokenBatch, with this many alternatives per token (0..20). */
  logprobs?: number;
}

/** Decode worker -> coordinator: generated tokens, in order. */
export interface TokenBatch {
  type: "TokenBatch";
  handoffId: string;
  tokens: number[];
  text: string;
  /** With `probe`: SHA-256 (hex) of the logits each token was sampled from. */
  logitsSha256: string[];
  /**
   * When the request asked for log probabilities: one per token (null for a token whose
   * logits this worker does not have, e.g. one sampled by the prefill worker).
   */
  logprobs?: (TokenLogprob | null)[];
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
  return Object.hasOwn(MESSAGE_CHECKS, type);
}

/** Checks a received control header as message `type`; throws ProtocolError naming the field. */
export function parseMessage<T extends ServeMessage>(header: Record<string, unknown>): T {
  const type = header.type;
  if (typeof type !== "string" || !isServeMessageType(type)) {
    throw new ProtocolError(`Unexpected control message type "${String(type).slice(0, 40)}"`);
  }
  const bad = MESSAGE_CHECKS[type](header);
  if (bad) throw new ProtocolError(`Malformed ${type}: field "${bad}" is missing or invalid`);
  return header as unknown as T;
}

export { decodeRequestPayload, encodeRequestPayload } from "./request_payload.ts";
