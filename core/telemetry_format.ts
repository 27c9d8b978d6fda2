/**
 * The handoff record's one-line summary for logs and reports (core/telemetry.ts holds the
 * record). Sizes and durations only: never prompt content, token values or checksums.
 *
 * @module
 */
import type { HandoffTelemetry } from "./telemetry.ts";
import type { SpeculationSummary } from "./telemetry_summary.ts";

/**
 * A compact one-line summary for logs and reports.
 *
 * @example
 * ```ts
 * formatTelemetry(t);
 * // "prefill->decode 32768 tok (8192 cached) 416.0 MiB [kv-page 256.0 MiB, ...] ..."
 * ```
 */
export function formatTelemetry(
  t: HandoffTelemetry,
  options: { side?: "both" | "prefill" } = {},
): string {
  const both = (options.side ?? "both") === "both";
  const parts: string[] = [];
  parts.push(`${t.sourceRole}->${t.destRole} ${t.promptTokens} tok (${t.cachedTokens} cached)`);
  const kinds = Object.entries(t.bytesByComponent).map(([k, b]) => `${k} ${_mib(b!)}`);
  parts.push(`${_mib(t.totalBytes)} [${kinds.join(", ")}]`);
  parts.push(`prefill ${_ms(t.prefillMs)}`);
  parts.push(`tail ${_ms(t.uncoveredTailMs)}`);
  const lead = t.captureLeadMs ?? null;
  if (lead !== null) {
    const first = t.captureSchedule?.[0]?.[0] ?? null;
    const span = first === null ? null : first - lead;
    parts.push(
      `${span === null ? "" : `layers captured over ${_ms(span)}, `}last ${_ms(lead)} ` +
        `before compute end`,
    );
  }
  if (t.lastChunkMs != null && t.lastChunkTokens != null) {
    parts.push(`last chunk ${t.lastChunkTokens} tok in ${_ms(t.lastChunkMs)}`);
  }
  if (t.prediction) parts.push(`predicted tail ${_ms(t.prediction.commitTailMs)}`);
  parts.push(
    `overlap ${t.overlapFraction === null ? "n/a" : `${Math.round(t.overlapFraction * 100)}%`}`,
  );
  if (t.stagedBeforePrefillEndFraction !== null) {
    parts.push(`staged early ${Math.round(t.stagedBeforePrefillEndFraction * 100)}%`);
  }
  parts.push(`export ${_ms(t.exportMs)} queue ${_ms(t.queueMs)} send ${_ms(t.wireMs)}`);
  if ((t.backlogBytes ?? 0) > 0 && (t.backlogMs ?? 0) > 0) {
    const rate = (t.backlogBytes! / t.backlogMs!) * 1000;
    parts.push(`backlog ${_mib(t.backlogBytes!)} at ${_gbps(rate)}`);
  }
  if (t.bandwidthBytesPerS !== null) parts.push(`link ${_gbps(t.bandwidthBytesPerS)}`);
  if (t.rttMs !== null) parts.push(`rtt ${_ms(t.rttMs)}`);
  if (both) {
    parts.push(`import ${_ms(t.importMs)} commit ${_ms(t.commitMs)}`);
    const arrived = t.recurrentArrivalBytes ?? 0, arrivalMs = t.recurrentArrivalMs ?? 0;
    if (arrived > 0 && arrivalMs > 0) {
      // The capture's pace, or the link's where the sender was behind: a span, not a rate.
      parts.push(`recurrent pieces arrived over ${_ms(arrivalMs)}`);
    }
    const tail = t.tailArrivalBytes ?? 0, tailMs = t.tailArrivalMs ?? 0;
    if (tail > 0 && tailMs > 0) {
      parts.push(`last frame arrived at ${_gbps((tail / tailMs) * 1000)}`);
    }
    parts.push(`TTFT ${_ms(t.ttftMs)} TPOT ${_ms(t.tpotMs)}`);
    if (t.firstTokenAfterPrefillMs !== null) {
      parts.push(`first token ${_ms(t.firstTokenAfterPrefillMs)} after prefill`);
    }
    parts.push(`target ${t.targetReady ? "ready" : "not ready"}`);
    if (t.mtpReady !== null) parts.push(`MTP ${t.mtpReady ? "ready" : "not ready"}`);
    if (t.speculation && t.speculation.mode !== "none") parts.push(_speculation(t.speculation));
    if (t.parity === "bitwise") parts.push("parity bitwise");
    if (t.parity === "not-claimed") {
      // The probe digests were not compared either (core/handoff_decoder.ts).
      const fields = t.parityFields.join(", ") || "unknown";
      parts.push(`parity not claimed (${fields}; probe digests not compared)`);
    }
  } else {
    parts.push(`commit round trip ${_ms(t.commitRoundTripMs)}`);
  }
  if (t.retries > 0) parts.push(`retries ${t.retries} (${t.retryReasons.join(", ")})`);
  if (t.fallbackReason) parts.push(`fallback ${t.fallbackReason}`);
  for (const f of t.fallbacks ?? []) parts.push(`${f.kind} after ${f.tokensBefore} tokens`);
  return parts.join(" ");
}

function _ms(ms: number | null): string {
  if (ms === null) return "n/a";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

function _mib(bytes: number): string {
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

function _gbps(bytesPerS: number): string {
  return `${((bytesPerS * 8) / 1e9).toFixed(2)} Gb/s`;
}

/** "speculation mtp+suffix: mtp 3/40, suffix 5/6 accepted in 25 rounds (native rollback)". */
function _speculation(s: SpeculationSummary): string {
  const fallback = (s.fallback ? `, fallback ${s.fallback}` : "") +
    (s.route ? `, route ${s.route}` : "");
  return `speculation ${s.mode}: mtp ${s.mtpAccepted}/${s.mtpDrafted}, suffix ` +
    `${s.suffixAccepted}/${s.suffixDrafted} accepted in ${s.rounds} rounds ` +
    `(${s.rollback ?? "no"} rollback${fallback})`;
}
