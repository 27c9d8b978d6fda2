/**
 * One point of the link matrix (bench/link_matrix.ts): the emulated link opened (or the loopback
 * itself at rate 0), measured as a live node measures it, the placement predicted from what the
 * run has learned, one handoff run whatever the decision, and the row recorded; and what a
 * served handoff teaches the nodes (`learnFrom`).
 */
import { runHandoff } from "../serve/coordinator.ts";
import type { HandoffRequest } from "../serve/coordinator.ts";
import type { LocalCluster } from "../serve/local_cluster.ts";
import type { PeerAddress } from "../serve/messages.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { LinkEstimator } from "../core/link_estimates.ts";
import type { RateRecorder } from "../core/node_rates.ts";
import { placeRequest } from "../core/placement.ts";
import { DEFAULT_LINK_MONITOR_OPTIONS, LinkMonitor } from "../transport/link_monitor.ts";
import { countUdpReceiveDrops, type UdpDropCount } from "../transport/mod.ts";
import { type EmulatedLink, NativeLinkRelay, openGridLink } from "./native_relay.ts";
import { pinToCpu, withProcessOn } from "./cpu_pin.ts";
import type { CertificationFile } from "../core/certification.ts";
import { HandoffCostRecorder, type MeasuredHandoffCosts } from "../core/link_costs.ts";
import type { CongestionControl, PlanOptions, StateSize } from "../core/planner.ts";
import type { HandoffTelemetry } from "../core/telemetry.ts";
import { expectedStateBytes, familySpec } from "../models/mod.ts";
import {
  earlierLossProbes,
  type LinkPoint,
  plannerLinks,
  pointKey,
  type PointSamples,
  pointTransfers,
  recordPointTransfer,
} from "./_matrix_link.ts";

/** The link matrix's models: what `--model` names. */
export const MATRIX_MODELS = {
  "super-mini": { family: "hybrid", preset: "super-mini", seed: 1 },
  "lab-state": { family: "hybrid", preset: "lab-state", seed: 1 },
} as const;

/**
 * The recurrent layers of a matrix model (the pieces its layer capture sends), from the
 * model's geometry; undefined for a name the matrix does not know.
 */
export function recurrentLayersOf(model: string): number | undefined {
  const m = (MATRIX_MODELS as Record<string, { family: string; preset: string; seed: number }>)[
    model
  ];
  return m
    ? expectedStateBytes(familySpec(m.family, m.preset, m.seed)).layers.recurrent
    : undefined;
}

export type MatrixPoint = LinkPoint;

/** One handoff through one link point, predicted and measured (milliseconds, bytes). */
export interface MatrixRow extends MatrixPoint {
  model: string;
  promptTokens: number;
  rep: number;
  refused: string | null;
  loadAvg1m: number;
  link: { rttMs: number | null; bytesPerS: number | null; source: string | null };
  decision: string | null;
  /** Colocated TTFT measured at this prompt in the run's calibration (the decoder prefilling). */
  colocatedTtftMs?: number | null;
  predicted: null | {
    ttftMs: number;
    /** The planner's colocated TTFT (the decoder's measured prefill rate). */
    colocatedTtftMs?: number;
    tailMs: number;
    /** Uncovered pages plus the snapshot: what the link adds after prefill ends. */
    transferMs: number;
    /** Decoder import left at commit plus the continuation probe. */
    commitMs: number;
    rttMs: number;
    probeMs: number;
    firstTokenOverheadMs: number;
  };
  measured: null | {
    ttftMs: number | null;
    tailMs: number | null;
    prefillMs: number | null;
    /** Prefill end to the manifest leaving: the rest of the transfer. */
    transferMs: number | null;
    /** Decoder: manifest received to commit (validate, tail import, probe). */
    commitMs: number | null;
    commitRoundTripMs: number | null;
    probeMs: number | null;
    lastImportMs: number;
    totalBytes: number;
    wireMs: number;
    stagedEarly: number | null;
  };
  relay: null | { drops: number; lateUsMean: number; lateUsMax: number };
  /** The CPU the relay was pinned to (absent or null: it floated). */
  relayCpu?: number | null;
  /**
   * The host's UDP receive-buffer drops during the handoff (Linux `RcvbufErrors`, host-wide)
   * and the default receive buffer; absent in runs before 2026-12-04, null where unreadable.
   */
  udp?: UdpDropCount;
  /** The handoff's whole record, so predictions can be replayed from what preceded it. */
  telemetry: HandoffTelemetry | null;
  /**
   * The bandwidth the prediction used: the point's earlier handoffs' own transfers where it
   * had served any ("handoff"), else the row's probe (absent: a run from before this field,
   * which always planned from the probe).
   */
  planned?: { bandwidthBytesPerS: number; source: "handoff" | "probe" } | null;
  /** The row's own link measurement (pings and the probe through the relay). */
  estimate:
    | { rttMs: number | null; bandwidthBytesPerS: number | null; lossFraction: number | null }
    | null;
}

/** What the grid's points share: the cluster, the relay, and what the nodes learned so far. */
export interface MatrixContext {
  cluster: LocalCluster;
  binary: string | null;
  ceilingBitsPerS: number;
  prefillRates: RateRecorder;
  decodeRates: RateRecorder;
  costs: HandoffCostRecorder;
  /**
   * The link residual per link point ("rate/rtt/loss"): a live pair learns it only from the
   * handoffs over its one link, and the grid's points are different links.
   */
  linkCosts: Map<string, HandoffCostRecorder>;
  /** Each point's earlier loss probes (`earlierLossProbes`). */
  lossByPoint: Map<string, number[]>;
  /** Each point's handoff samples (`recordPointTransfer`). */
  transfersByPoint: Map<string, PointSamples>;
  /** State sizes as the runtime exported them (largest seen). */
  state: StateSize;
  model: string;
  certification: CertificationFile | null;
  planOptions: Partial<PlanOptions>;
  /** The workers' (and the bench's probe's) congestion controller. */
  congestionControl: CongestionControl;
  /** This llama.cpp build, as the certification file names it. */
  llamaBuild: string;
  /**
   * `--pin-workers split`: each point's relay is pinned to `cpu` where its rate is within
   * `bitsPerSMax` (what the relay sustained there sharing the CPU with both ends, less the
   * relay's margin), and floats above it. Null: it always floats.
   */
  relayCpu: { cpu: number; bitsPerSMax: number } | null;
  /**
   * `--pin-workers split`: the prefill worker's network CPU, which each point's probe is sent
   * from, as the state is (FINDINGS section 0000000000). Null: the probe floats.
   */
  probeCpu: number | null;
}

/** What a pair learns from its handoffs, live (`MatrixContext`) and in the replay alike. */
export type MatrixLearning = Pick<
  MatrixContext,
  "prefillRates" | "decodeRates" | "costs" | "linkCosts" | "state" | "transfersByPoint"
>;

/**
 * What a served handoff teaches the nodes: rates, state sizes, the tail's fixed costs, and
 * over a link point, that link's bandwidth from the handoff's own transfer.
 */
export function learnFrom(
  x: MatrixLearning,
  t: HandoffTelemetry,
  clientTtftMs: number | null,
  predictedLinkMs: number | null,
  /** The RTT the prediction used (the row's pings); absent: the handoff's own figure. */
  rttMs?: number | null,
  /** The link rate the prediction used (the row's probe), bytes/s. */
  bandwidthBytesPerS?: number | null,
  /** The link point it ran over (absent: the unshaped calibration). */
  point?: MatrixPoint,
): void {
  x.prefillRates.recordHandoffPrefill(t);
  if (t.tpotMs) x.decodeRates.recordDecode(1, t.tpotMs, t.promptTokens);
  const facts = { ...t, rttMs: rttMs ?? t.rttMs, bandwidthBytesPerS: bandwidthBytesPerS ?? null };
  x.costs.record(facts, clientTtftMs, predictedLinkMs);
  if (point) {
    linkCostsAt(x.linkCosts, point).record(facts, clientTtftMs, predictedLinkMs);
    recordPointTransfer(x.transfersByPoint, point, t, facts.rttMs ?? 0);
  }
  const b = t.bytesByComponent;
  x.state.kvBytesPerToken = Math.max(x.state.kvBytesPerToken, (b["kv-page"] ?? 0) / t.promptTokens);
  x.state.recurrentBytes = Math.max(x.state.recurrentBytes, (b.conv ?? 0) + (b.ssm ?? 0));
}

/**
 * The costs a pair on link point `p` plans with: what every handoff taught (the nodes' own
 * costs), with the link residual from this point's handoffs alone, as a live pair learns it
 * only over its one link; absent until the point served one.
 */
export function pointCosts(
  all: HandoffCostRecorder,
  byPoint: Map<string, HandoffCostRecorder>,
  p: MatrixPoint,
): MeasuredHandoffCosts {
  return { ...all.costs(), linkResidual: linkCostsAt(byPoint, p).costs().linkResidual };
}

/**
 * The recorder of a link point's own residual, in `byPoint` (the matrix's, or a replay's):
 * created on the point's first handoff.
 */
export function linkCostsAt(
  byPoint: Map<string, HandoffCostRecorder>,
  p: MatrixPoint,
): HandoffCostRecorder {
  const key = pointKey(p);
  let c = byPoint.get(key);
  if (!c) byPoint.set(key, c = new HandoffCostRecorder());
  return c;
}

export async function loadAvg(): Promise<number> {
  try {
    return Number((await Deno.readTextFile("/proc/loadavg")).split(" ")[0]);
  } catch {
    return NaN;
  }
}

export async function runPoint(
  x: MatrixContext,
  p: MatrixPoint,
  promptTokens: number,
  actualTokens: number,
  rep: number,
  request: HandoffRequest,
): Promise<MatrixRow> {
  const row: MatrixRow = {
    ...p,
    model: x.model,
    promptTokens,
    rep,
    refused: null,
    loadAvg1m: await loadAvg(),
    link: { rttMs: null, bytesPerS: null, source: null },
    decision: null,
    predicted: null,
    measured: null,
    relay: null,
    telemetry: null,
    estimate: null,
  };
  const decode = x.cluster.decode.peer;
  let link: EmulatedLink | null;
  try {
    link = await _openPointLink(x, p, rep, row);
  } catch (error) {
    row.refused = (error as Error).message.split(":")[0];
    return row;
  }
  try {
    const via = link
      ? { ...decode, host: link.endpoint.hostname, port: link.endpoint.port }
      : decode;
    const links = await _measurePointLink(x, p, via, row);
    _predictPoint(x, p, actualTokens, links, row);
    const udpDrops = await countUdpReceiveDrops();
    const r = await runHandoff(x.cluster.client, { ...request, decode: via });
    row.udp = await udpDrops();
    row.loadAvg1m = (row.loadAvg1m + await loadAvg()) / 2;
    if (r.placement !== "disaggregated") {
      row.refused = `handoff fell back: ${r.fallbackReason}`;
      return row;
    }
    const t = r.telemetry;
    row.telemetry = t;
    row.measured = _measured(r.ttftMs, t);
    learnFrom(
      x,
      t,
      r.ttftMs,
      row.predicted?.transferMs ?? null,
      row.estimate?.rttMs,
      row.planned?.bandwidthBytesPerS,
      p,
    );
    if (link instanceof NativeLinkRelay) row.relay = await _relayFigures(link);
    return row;
  } finally {
    link?.close();
  }
}

/**
 * The point's emulated link, its relay pinned where `x.relayCpu` says (recorded in
 * `row.relayCpu`); null at rate 0: no relay, the loopback itself (unshaped). Throws when the
 * relay refuses the point.
 */
async function _openPointLink(
  x: MatrixContext,
  p: MatrixPoint,
  rep: number,
  row: MatrixRow,
): Promise<EmulatedLink | null> {
  if (p.rateBitsPerS <= 0) return null;
  const link = await openGridLink(x.binary, x.cluster.decode.peer, p, {
    ceilingBitsPerS: x.ceilingBitsPerS,
    seed: 7 + rep,
  });
  const r = x.relayCpu;
  if (r !== null && link instanceof NativeLinkRelay && p.rateBitsPerS <= r.bitsPerSMax) {
    await pinToCpu(link.pid, r.cpu).catch((error) => {
      link?.close();
      throw error;
    });
    row.relayCpu = r.cpu;
  }
  return link;
}

/**
 * Measures the link to `via` as a live node does (pings and one probe) into `row.estimate` and
 * `row.link`; the estimator the planner reads (`plannerLinks`: the point's handoff samples
 * once it has any, its loss probes), and what it planned with in `row.planned`.
 */
async function _measurePointLink(
  x: MatrixContext,
  p: MatrixPoint,
  via: PeerAddress,
  row: MatrixRow,
): Promise<LinkEstimator> {
  const links = new LinkEstimator();
  const monitor = new LinkMonitor(x.cluster.prefill.peer.nodeId, links, {
    pingsPerMeasure: 10,
  });
  const conn = await x.cluster.client.connect(via);
  // The probe a live node sends (8 MiB), whatever the emulated rate: sized from the rate it
  // read far over it (FINDINGS section 000). Unshaped loopback: 16 MiB.
  const probeBytes = p.rateBitsPerS > 0 ? DEFAULT_LINK_MONITOR_OPTIONS.probeBytes : 16 << 20;
  await withProcessOn(x.probeCpu, () => monitor.measure(conn, probeBytes));
  await conn.close();
  const pair = { from: x.cluster.prefill.peer.nodeId, to: x.cluster.decode.peer.nodeId };
  const now = performance.now();
  const e = links.estimate(pair, now);
  row.estimate = e
    ? { rttMs: e.rttMs, bandwidthBytesPerS: e.bandwidthBytesPerS, lossFraction: e.lossFraction }
    : null;
  row.link = {
    rttMs: e?.rttMs ?? null,
    bytesPerS: e?.bandwidthBytesPerS ?? null,
    source: e?.bandwidthSource ?? null,
  };
  const earlierLoss = earlierLossProbes(x.lossByPoint, p, e?.lossFraction ?? null);
  if (e?.rttMs == null || e.bandwidthBytesPerS === null) return links;
  const transfers = pointTransfers(x.transfersByPoint, p);
  const planned = plannerLinks(
    pair,
    { rttMs: e.rttMs, bandwidthBytesPerS: e.bandwidthBytesPerS, lossFraction: e.lossFraction },
    transfers,
    earlierLoss,
    now,
  );
  const used = planned.estimate(pair, now)!;
  row.planned = {
    bandwidthBytesPerS: used.bandwidthBytesPerS!,
    source: used.bandwidthSource === "handoff" ? "handoff" : "probe",
  };
  return planned;
}

/** The planner's decision and prediction from what the run has learned, into `row`. */
function _predictPoint(
  x: MatrixContext,
  p: MatrixPoint,
  actualTokens: number,
  links: LinkEstimator,
  row: MatrixRow,
): void {
  const d = placeRequest({
    promptTokens: actualTokens,
    prefiller: {
      nodeId: x.cluster.prefill.peer.nodeId,
      rates: x.prefillRates.rates(),
      hasRole: true,
    },
    decoder: {
      nodeId: x.cluster.decode.peer.nodeId,
      rates: x.decodeRates.rates(),
      hasRole: true,
      freeBytes: 64 * 2 ** 30,
    },
    schemaShared: true,
    identityMatch: true,
    family: "hybrid",
    llamaBuild: x.llamaBuild,
    state: { ...x.state },
    chunkTokens: RUNTIME_DEFAULTS.chunkTokens,
    // The prefill worker's layer capture (on wherever the shim is built) sends the
    // recurrent state, and the last chunk's page, while the last chunk computes.
    snapshotDuringLastChunk: true,
    lastPageDuringLastChunk: true,
    congestionControl: x.congestionControl,
    costs: pointCosts(x.costs, x.linkCosts, p),
  }, {
    links,
    nowMs: performance.now(),
    certification: x.certification,
    options: x.planOptions,
  });
  row.decision = `${d.placement}: ${
    d.reasons.filter((r) => r.code !== "chosen").map((r) => r.code).join(",")
  }`;
  const est = d.estimates;
  if (d.prediction && est) {
    row.predicted = {
      ttftMs: d.prediction.ttftDisaggregatedMs,
      colocatedTtftMs: d.prediction.ttftColocatedMs,
      tailMs: d.prediction.commitTailMs,
      transferMs: est.uncoveredKvMs + est.snapshotTransferMs,
      commitMs: est.decoderCommitMs,
      rttMs: est.commitRoundTripMs,
      probeMs: est.probeMs ?? 0,
      firstTokenOverheadMs: x.costs.costs().firstTokenOverheadMs ?? 0,
    };
  }
}

/** The row's measured figures, from the client's TTFT and the handoff's record. */
function _measured(ttftMs: number, t: HandoffTelemetry): MatrixRow["measured"] {
  return {
    ttftMs,
    tailMs: t.uncoveredTailMs,
    prefillMs: t.prefillMs,
    transferMs: t.uncoveredTailMs !== null && t.commitRoundTripMs !== null
      ? t.uncoveredTailMs - t.commitRoundTripMs
      : null,
    commitMs: t.commitMs,
    commitRoundTripMs: t.commitRoundTripMs,
    probeMs: t.probeMs,
    lastImportMs: t.lastImportMs,
    totalBytes: t.totalBytes,
    wireMs: t.wireMs,
    stagedEarly: t.stagedBeforePrefillEndFraction,
  };
}

/** What the native relay dropped, and how late its deliveries were (both directions). */
async function _relayFigures(link: NativeLinkRelay): Promise<MatrixRow["relay"]> {
  const s = await link.stats();
  return {
    drops: await link.drops(),
    lateUsMean: (s.forward.lateUsMean + s.backward.lateUsMean) / 2,
    lateUsMax: Math.max(s.forward.lateUsMax, s.backward.lateUsMax),
  };
}
