/**
 * The field checks behind `parseMessage` (messages.ts): for each application message type, the
 * first field of a received header that is missing or invalid. A check names the field, never
 * its content.
 */
import { CONGESTION_CONTROLS, type CongestionControl, isAbortReason } from "../core/mod.ts";
import { SPECULATION_MODES, type SpeculationMode } from "../core/speculation.ts";
import { TOP_LOGPROBS_MAX } from "../core/logprobs.ts";
import { COUNTER_FIELDS } from "./worker_counters.ts";
import {
  GENERATE_TOKENS_MAX,
  PROMPT_BYTES_MAX,
  PROMPT_SPECIAL_SPANS_MAX,
  SENT_TOKENS_MAX,
  TOKEN_BATCH_TEXT_BYTES_MAX,
  TOKEN_BATCH_TOKENS_MAX,
  TURN_ENDS_MAX,
} from "./message_bounds.ts";
import type { ServeMessage } from "./messages.ts";

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

/** A TokenLogprob: a finite log probability and at most TOP_LOGPROBS_MAX alternatives. */
function logprobOk(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const x = v as Record<string, unknown>;
  return num(x.logprob) && Array.isArray(x.top) && x.top.length <= TOP_LOGPROBS_MAX &&
    x.top.every((p) => Array.isArray(p) && p.length === 2 && count(p[0], 0x7fffffff) && num(p[1]));
}

/** Absent, or an even list of byte offsets (their order is checked where they are used). */
function spansOk(v: unknown): boolean {
  return v === undefined || (Array.isArray(v) && v.length % 2 === 0 &&
    v.length <= 2 * PROMPT_SPECIAL_SPANS_MAX && v.every((x) => count(x, PROMPT_BYTES_MAX)));
}

const turnEndsOk = (v: unknown) =>
  Array.isArray(v) && v.length <= TURN_ENDS_MAX &&
  v.every((x, i) => count(x, PROMPT_BYTES_MAX) && (i === 0 || x > v[i - 1]));

function addressOk(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const a = v as Record<string, unknown>;
  return str(a.host) && count(a.port, 65535) && str(a.nodeId, 64);
}

/** Per message type: the first field that is missing or invalid, or null when all are valid. */
export const MESSAGE_CHECKS: Record<ServeMessage["type"], Checker> = {
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
      : m.completeOnDecoderLoss !== undefined && typeof m.completeOnDecoderLoss !== "boolean"
      ? "completeOnDecoderLoss"
      : !spansOk(m.promptSpecialSpans)
      ? "promptSpecialSpans"
      : m.logprobs !== undefined && !count(m.logprobs, TOP_LOGPROBS_MAX)
      ? "logprobs"
      : m.turnEnds !== undefined && !turnEndsOk(m.turnEnds)
      ? "turnEnds"
      : null,
  CancelRequest: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : m.tenantId !== undefined && !str(m.tenantId, 128)
      ? "tenantId"
      : null,
  PrefillOutcome: (m) =>
    !str(m.handoffId, 64)
      ? "handoffId"
      : !["committed", "fallback", "failed", "busy"].includes(m.outcome as string)
      ? "outcome"
      : m.reason !== null && !isAbortReason(m.reason)
      ? "reason"
      : !objectOrNull(m.telemetry)
      ? "telemetry"
      : m.completedHere !== undefined && typeof m.completedHere !== "boolean"
      ? "completedHere"
      : m.linkLoss !== undefined && m.linkLoss !== null && !linkLossOk(m.linkLoss)
      ? "linkLoss"
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
      : m.logprob !== undefined && !logprobOk(m.logprob)
      ? "logprob"
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
      : m.sentTokensInPayload !== undefined && !count(m.sentTokensInPayload, SENT_TOKENS_MAX)
      ? "sentTokensInPayload"
      : m.sentTokens !== undefined && (!Array.isArray(m.sentTokens) ||
          m.sentTokens.length > SENT_TOKENS_MAX || !m.sentTokens.every((t) => count(t, 0x7fffffff)))
      ? "sentTokens"
      : m.speculation !== undefined && !SPECULATION_MODES.includes(m.speculation as SpeculationMode)
      ? "speculation"
      : !spansOk(m.promptSpecialSpans)
      ? "promptSpecialSpans"
      : m.logprobs !== undefined && !count(m.logprobs, TOP_LOGPROBS_MAX)
      ? "logprobs"
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
      : m.logprobs !== undefined && (!Array.isArray(m.logprobs) ||
          m.logprobs.length !== m.tokens.length || !m.logprobs.every((x) =>
            x === null || logprobOk(x)
          ))
      ? "logprobs"
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

/** A LinkLossReport: counts within a probe, no more loss events than lost, a finite age. */
function linkLossOk(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const l = v as Record<string, unknown>;
  return count(l.probe, 0xffffffff) && count(l.sent, 1e6) && (l.sent as number) > 0 &&
    count(l.received, l.sent as number) &&
    count(l.lossEvents, (l.sent as number) - (l.received as number)) &&
    typeof l.ageMs === "number" &&
    Number.isFinite(l.ageMs) && l.ageMs >= 0 &&
    (l.congestionControl === undefined ||
      CONGESTION_CONTROLS.includes(l.congestionControl as CongestionControl)) &&
    (l.bandwidthProbe === undefined || bandwidthProbeOk(l.bandwidthProbe));
}

/** A bandwidth probe's figures: bytes within a probe's bound, a positive finite receive time. */
function bandwidthProbeOk(v: unknown): boolean {
  if (typeof v !== "object" || v === null) return false;
  const b = v as Record<string, unknown>;
  return count(b.bytes, 2 ** 30) && (b.bytes as number) > 0 && typeof b.receiveMs === "number" &&
    Number.isFinite(b.receiveMs) && b.receiveMs > 0;
}
