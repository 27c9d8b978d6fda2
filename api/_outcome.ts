/**
 * What a finished request leaves behind: its record's outcome fields and its metrics, with
 * bounded labels (a fallback's or a failure's reason from a short fixed list, never a
 * message's free text).
 */
import { HandoffAbortedError } from "../core/mod.ts";
import type { HandoffResult } from "../serve/coordinator.ts";
import { ApiError } from "./errors.ts";
import type { ApiMetrics } from "./metrics.ts";
import type { RequestRecord } from "./telemetry.ts";

/** How an admitted request ended, as `ApiService` saw it. */
export interface FinishedRequest {
  /** Null when a stop sequence cancelled the request on the workers. */
  result: HandoffResult | null;
  placement: "disaggregated" | "colocated";
  fallbackReason: string | null;
  generated: number;
  finishReason: "stop" | "length";
  /** The request's arrival (`performance.now()`): TPOT and e2e count from it. */
  t0: number;
}

/** Fills the record's outcome and counts the request in the metrics. */
export function finishRecord(
  m: ApiMetrics,
  record: RequestRecord,
  finished: FinishedRequest,
): void {
  const { result, placement, fallbackReason, generated, finishReason } = finished;
  const e2eMs = performance.now() - finished.t0;
  record.placement = placement;
  record.fallbackReason = fallbackReason;
  record.generatedTokens = generated;
  record.finishReason = finishReason;
  record.handoff = result?.telemetry ?? null;
  record.linkLoss = result?.linkLoss ?? null;
  if (record.ttftMs !== null && generated > 1) {
    record.tpotMs = (e2eMs - record.ttftMs) / (generated - 1);
    m.tpot.observe(record.tpotMs / 1000);
  }
  m.e2e.observe(e2eMs / 1000);
  m.promptTokens.inc(record.promptTokens);
  if (result && placement === "disaggregated") {
    m.promptTokensCached.inc(result.telemetry.cachedTokens ?? 0);
  }
  m.generationTokens.inc(generated);
  m.success.inc({ finished_reason: finishReason });
  m.placements.inc({ placement });
  if (record.plannedPlacement === "disaggregated" && placement === "colocated") {
    m.fallbacks.inc({ reason: fallbackCode(result) });
  }
  if (result && placement === "disaggregated") m.observeHandoff(result.telemetry);
  if (result) m.observeRequest(result.telemetry, result.fallbacks);
}

/** A bounded label for a fallback: core's abort reason, else a coarse class. */
function fallbackCode(result: HandoffResult | null): string {
  if (!result) return "unknown";
  if (result.telemetry.fallbackReason) return result.telemetry.fallbackReason;
  const why = result.fallbackReason ?? "";
  if (why.startsWith("prefill-busy")) return "prefill-busy";
  if (why.startsWith("the prefill worker is unreachable")) return "prefill-unreachable";
  if (why.startsWith("the prefill worker was lost")) return "connection-lost";
  if (why.startsWith("decode worker not eligible")) return "not-eligible";
  return "other";
}

/** A bounded label for a failure. */
export function failureReason(error: unknown): string {
  if (error instanceof HandoffAbortedError) return String(error.reason ?? "aborted");
  if (error instanceof ApiError) return error.options.code ?? error.type;
  return error instanceof Error ? error.name : "unknown";
}
