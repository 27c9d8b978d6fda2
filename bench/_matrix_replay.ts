/**
 * The link matrix's replay (link_matrix_report.ts reports it): each row's prediction made again
 * with the planner as it now stands, from only what the run had measured before that row (the
 * same-run calibration, the handoffs served earlier, the row's own pings and probe). A point's
 * bandwidth is its earlier handoffs' own transfers once it has served one (`plannerLinks`), as
 * the run planned it, also on runs from before the run planned so.
 */
import type { LinkEstimator } from "../core/link_estimates.ts";
import { HandoffCostRecorder, type MeasuredHandoffCosts } from "../core/link_costs.ts";
import { RateRecorder } from "../core/node_rates.ts";
import { placeRequest } from "../core/placement.ts";
import type { CongestionControl } from "../core/planner.ts";
import type { HandoffTelemetry } from "../core/telemetry.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import type { CalibrationRun, MatrixRow } from "./link_matrix.ts";
import { learnFrom, type MatrixLearning, pointCosts, recurrentLayersOf } from "./_matrix_point.ts";
import {
  earlierLossProbes,
  plannerLinks,
  type PointSamples,
  pointTransfers,
} from "./_matrix_link.ts";

/** A run file as bench/link_matrix.ts writes it (the fields the replay and the report read). */
export interface RunFile {
  relay: string;
  ceiling: { bitsPerS: number; rttFloorUsMedian: number; trialsBitsPerS?: number[] } | null;
  rows: MatrixRow[];
  calibration: CalibrationRun[];
  /** Calibration one chunk deep, before every row (absent: a run from before it was taken). */
  shallowCalibration?: CalibrationRun[];
  /** llama.cpp threads per worker (absent or null: the runtime default). */
  workerThreads?: number | null;
  /** Each worker pinned to a CPU of its own (absent: a run from before the option, unpinned). */
  /** true or "whole": each worker on a CPU of its own; "split": bench/cpu_pin.ts. */
  pinWorkers?: boolean | "split" | "whole";
  /**
   * The prefill worker sent the last page during the last chunk (absent: a run from before
   * that capture, which sent it after).
   */
  lastPageCapture?: boolean;
  /** The workers' congestion controller (absent: a run from before the option, Cubic). */
  congestionControl?: CongestionControl;
}

/** One row's replayed prediction beside its measurement (ms). */
export interface Replayed {
  row: MatrixRow;
  ttft: [pred: number, meas: number] | null;
  tail: [pred: number, meas: number] | null;
  /** Prefill end to the manifest reaching the decoder: what the link and the prefiller add. */
  link: [pred: number, meas: number] | null;
  /**
   * TTFT plus the tail: the request's start to the decoder owning the state. Where the state's
   * transfer outlasts the prefill, the tail is what remains of it after a prefill whose length
   * varies, and this sum is what the link fixes.
   */
  ready: [pred: number, meas: number] | null;
  probe: [pred: number, meas: number] | null;
  /**
   * Where the prediction's bandwidth came from: the point's earlier handoffs (a pair that has
   * served one over this link) or the row's probe (the point's first handoff; null: no row).
   */
  bandwidthFrom: "handoff" | "probe" | null;
}

/** What a replay has learned so far: the nodes' rates, the pair's costs, the state's size. */
/** What the replay has learned so far, as a live pair would have (`learnFrom`). */
type _Learned = MatrixLearning;

function _learned(run: RunFile): _Learned {
  return {
    prefillRates: new RateRecorder("p", 3),
    decodeRates: new RateRecorder("d", 3),
    costs: new HandoffCostRecorder(),
    linkCosts: new Map<string, HandoffCostRecorder>(),
    transfersByPoint: new Map<string, PointSamples>(),
    state: {
      kvBytesPerToken: 0,
      recurrentBytes: 0,
      recurrentLayers: recurrentLayersOf(run.rows[0]?.model ?? ""),
    },
  };
}

/** Learns from a prompt's calibration run (disaggregated and colocated). */
function _learnCalibration(l: _Learned, c: CalibrationRun) {
  learnFrom(l, c.telemetry, c.clientTtftMs ?? c.telemetry.ttftMs, 0);
  l.decodeRates.recordPrefill(c.promptTokens, c.colocatedTtftMs);
  if (c.colocatedTpotMs) l.decodeRates.recordDecode(1, c.colocatedTpotMs, c.promptTokens);
}

type _Estimate = NonNullable<MatrixRow["estimate"]> & { rttMs: number; bandwidthBytesPerS: number };

/**
 * The link as the row's planner read it: its pings, the point's handoff samples (else its
 * probe), the point's loss probes.
 */
function _rowLinks(row: MatrixRow, e: _Estimate, l: _Learned, lossByPoint: Map<string, number[]>) {
  const earlier = earlierLossProbes(lossByPoint, row, e.lossFraction ?? null);
  const transfers = pointTransfers(l.transfersByPoint, row);
  return plannerLinks({ from: "p", to: "d" }, e, transfers, earlier, 0);
}

/** The planner's decision for `row` from what the replay has learned before it. */
function _placeRow(
  run: RunFile,
  row: MatrixRow,
  t: HandoffTelemetry,
  l: _Learned,
  links: LinkEstimator,
  without: readonly string[],
) {
  return placeRequest({
    promptTokens: t.promptTokens, // the prompt's real token count (the row names the nominal)
    prefiller: { nodeId: "p", rates: l.prefillRates.rates(), hasRole: true },
    decoder: { nodeId: "d", rates: l.decodeRates.rates(), hasRole: true, freeBytes: 2 ** 40 },
    schemaShared: true,
    identityMatch: true,
    family: "hybrid",
    llamaBuild: "bench",
    state: { ...l.state },
    chunkTokens: RUNTIME_DEFAULTS.chunkTokens,
    snapshotDuringLastChunk: true,
    lastPageDuringLastChunk: run.lastPageCapture === true,
    congestionControl: run.congestionControl ?? "cubic",
    costs: Object.fromEntries(
      Object.entries(pointCosts(l.costs, l.linkCosts, row)).filter(([k]) => !without.includes(k)),
    ) as MeasuredHandoffCosts,
  }, { links, nowMs: 0, certification: null });
}

/** The row's predictions beside its measurements. */
function _replayed(
  row: MatrixRow,
  d: ReturnType<typeof placeRequest>,
  m: NonNullable<MatrixRow["measured"]>,
  e: _Estimate,
  bandwidthFrom: Replayed["bandwidthFrom"],
): Replayed {
  const est = d.estimates!, p = d.prediction!;
  const predLink = p.commitTailMs - est.decoderCommitMs - est.commitRoundTripMs / 2;
  const measLink = m.tailMs !== null && m.commitMs !== null
    ? m.tailMs - m.commitMs - e.rttMs / 2
    : null;
  return {
    row,
    ttft: m.ttftMs === null ? null : [p.ttftDisaggregatedMs, m.ttftMs],
    tail: m.tailMs === null ? null : [p.commitTailMs, m.tailMs],
    link: measLink === null ? null : [predLink, measLink],
    ready: m.ttftMs === null || m.tailMs === null
      ? null
      : [p.ttftDisaggregatedMs + p.commitTailMs, m.ttftMs + m.tailMs],
    probe: m.probeMs === null ? null : [est.probeMs ?? 0, m.probeMs],
    bandwidthFrom,
  };
}

/** Replays one run's predictions in row order, optionally without some measured cost terms. */
export function replay(run: RunFile, without: readonly string[] = []): Replayed[] {
  const l = _learned(run);
  for (const c of run.shallowCalibration ?? []) _learnCalibration(l, c);
  const lossByPoint = new Map<string, number[]>();
  // Calibration runs precede their prompt's rows, one per prompt, in the same order.
  const prompts = [...new Set(run.rows.map((r) => r.promptTokens))];
  const seen = new Set<number>();
  const out: Replayed[] = [];
  for (const row of run.rows) {
    if (!seen.has(row.promptTokens)) {
      seen.add(row.promptTokens);
      const cal = run.calibration[prompts.indexOf(row.promptTokens)];
      for (const c of cal ? [cal] : []) _learnCalibration(l, c);
    }
    const t = row.telemetry, m = row.measured, e = row.estimate;
    if (row.refused || !t || !m || !e || e.rttMs === null || e.bandwidthBytesPerS === null) {
      const none = { ttft: null, tail: null, link: null, ready: null, probe: null };
      out.push({ row, ...none, bandwidthFrom: null });
      continue;
    }
    const known = e as _Estimate;
    const links = _rowLinks(row, known, l, lossByPoint);
    const d = _placeRow(run, row, t, l, links, without);
    const planned = links.estimate({ from: "p", to: "d" }, 0)!;
    out.push(
      _replayed(row, d, m, known, planned.bandwidthSource === "handoff" ? "handoff" : "probe"),
    );
    const est = d.estimates!;
    learnFrom(
      l,
      t,
      m.ttftMs,
      est.uncoveredKvMs + est.snapshotTransferMs,
      e.rttMs,
      planned.bandwidthBytesPerS,
      row,
    );
  }
  return out;
}
