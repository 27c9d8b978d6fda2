/**
 * The cost model against emulated links (`deno task bench --only link`): two workers on
 * loopback, the decode worker behind the UDP link emulator (link_emulator.ts), and per grid
 * point (rate, RTT, loss) the planner's prediction next to a measured handoff.
 *
 * Per point: the link is measured the way a live node measures it (pings on the control
 * stream and one bounded probe, through the same relay, by this process on behalf of the
 * prefill worker), the node rates come from a calibration on the unshaped path (one
 * disaggregated and one colocated run per prompt), `placeRequest()` predicts TTFT and the tail
 * (prefill end to CommitAck), then one handoff runs through the relay. Points over the relay's
 * measured ceiling are refused by the emulator and listed as such: the cost model covers them.
 * The planner's decision is shown; the handoff is run whatever it says, to be compared.
 */
import { ensureModelFile } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { type LocalCluster, startLocalCluster } from "../serve/local_cluster.ts";
import type { HandoffRequest } from "../serve/coordinator.ts";
import type { PeerAddress } from "../serve/messages.ts";

/** What every grid point shares. */
interface _Ctx {
  ceilingBitsPerS: number;
  /** The native relay (null: the TypeScript relay, no C compiler here). */
  relayBinary: string | null;
  cluster: LocalCluster;
  base: HandoffRequest;
  /** Each node's own measurements so far (calibration, then every handoff it served). */
  recorders: { prefiller: RateRecorder; decoder: RateRecorder };
  /** The pair's tail costs from the handoffs served so far (core/link_costs.ts). */
  costs: HandoffCostRecorder;
  certified: boolean;
  kvBytesPerToken: number;
}
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { llamaBuild as llamaBuildOf, LlamaModel, loadLlama } from "../ffi/mod.ts";
import { handoffTransferSample, LinkEstimator } from "../core/link_estimates.ts";
import { RateRecorder } from "../core/node_rates.ts";
import { HandoffCostRecorder } from "../core/link_costs.ts";
import { placeRequest } from "../core/placement.ts";
import { isCertified, parseCertification } from "../core/certification.ts";
import { DEFAULT_LINK_MONITOR_OPTIONS, LinkMonitor } from "../transport/link_monitor.ts";
import { measureRelayCeiling } from "./link_emulator.ts";
import {
  buildNativeRelay,
  type EmulatedLink,
  measureNativeCeiling,
  openGridLink,
} from "./native_relay.ts";
import { runCcComparison } from "./cc_bench.ts";
import type { HandoffTelemetry } from "../core/telemetry.ts";
import type { PeerConnection } from "../transport/mod.ts";
import { cacheDir } from "../cli/paths.ts";
import { type DegradeResult, runDegrade } from "./_link_degrade.ts";

export type { DegradeResult };

export interface LinkPoint {
  rateBitsPerS: number;
  rttMs: number;
  lossFraction: number;
}

export interface LinkBenchRow extends LinkPoint {
  promptTokens: number;
  /** Null when measured; otherwise why the point was not run. */
  refused: string | null;
  measuredRttMs: number | null;
  measuredBytesPerS: number | null;
  decision: string | null;
  predictedTtftMs: number | null;
  measuredTtftMs: number | null;
  predictedTailMs: number | null;
  measuredTailMs: number | null;
  stateBytes: number | null;
  relayDrops: number | null;
  /** Where the bandwidth the prediction used came from: the probe, or the previous handoff. */
  bandwidthSource: string | null;
  /** The handoff's own rate: bytes over its summed write time. */
  achievedBytesPerS: number | null;
  /** The prefill the handoff actually took (compute noise shows here, not in the link). */
  measuredPrefillMs: number | null;
  /** The handoff's delivery-based bandwidth sample (bytes/s), fed to the next prediction. */
  handoffSampleBytesPerS: number | null;
  /** The decoder's continuation probe inside the tail: predicted (decode rate) and measured. */
  predictedProbeMs: number | null;
  measuredProbeMs: number | null;
}

/** The grid, reduced: every rate with the RTTs and losses below. */
export const LINK_RATES = [10e6, 20e6, 100e6, 400e6, 1e9];
export const LINK_RTTS_MS = [0.2, 2, 10];
export const LINK_LOSSES = [0, 0.001];

const SENTENCE = "the quick brown fox jumps over the lazy dog and ";

/**
 * Prompts of about `n` tokens in `model`'s tokenizer (one sentence repeated, a few tokens of
 * headroom for the template), for the link benches.
 */
export async function promptsOfTokens(model: string): Promise<(n: number) => string> {
  using m = await LlamaModel.load(loadLlama(), model);
  const perSentence = m.vocab.tokenize(SENTENCE.repeat(100), false).length / 100;
  return (n) => SENTENCE.repeat(Math.max(1, Math.floor((n - 8) / perSentence)));
}
const MODEL = { family: "dense", preset: "super-mini", seed: 1 } as const;

export async function runLinkBench(o: { modelDir: string; quick: boolean }) {
  const model = await ensureModelFile(o.modelDir, MODEL);
  const prompts = o.quick ? [512] : [512, 1024];
  const points = _gridPoints(o.quick);
  const relayBinary = await buildNativeRelay();
  const ceiling = relayBinary
    ? await measureNativeCeiling(relayBinary)
    : await measureRelayCeiling(5000);
  const promptFor = await promptsOfTokens(model);
  const cluster = await startLocalCluster({ args: ["--model", model, "--ctx", "2048"] });
  const rows: LinkBenchRow[] = [];
  let degrade: DegradeResult | null = null;
  let calibration: unknown = null;
  const cert = await _certification();
  try {
    const base = baseHandoffRequest(cluster, 120_000);
    const recorders = {
      prefiller: new RateRecorder(cluster.prefill.peer.nodeId),
      decoder: new RateRecorder(cluster.decode.peer.nodeId),
    };
    const costs = new HandoffCostRecorder();
    const bytesPerToken = await _calibrate(cluster, base, prompts.map(promptFor), recorders, costs);
    const family = "dense";
    const build = llamaBuildOf(loadLlama());
    for (const point of points) {
      for (const n of prompts) {
        rows.push(
          ...await _runPoint(point, n, {
            ceilingBitsPerS: ceiling.bitsPerS,
            relayBinary,
            cluster,
            base: { ...base, prompt: promptFor(n) },
            recorders,
            costs,
            certified: isCertified(cert, family, build),
            kvBytesPerToken: bytesPerToken,
          }),
        );
      }
    }
    calibration = {
      prefiller: recorders.prefiller.rates(),
      decoder: recorders.decoder.rates(),
      bytesPerToken,
    };
    degrade = await runDegrade(cluster, ceiling.bitsPerS, relayBinary, {
      ...base,
      prompt: promptFor(prompts[0]),
    });
  } finally {
    await cluster.stop();
  }
  const cc = await _ccComparison(ceiling.bitsPerS, relayBinary, o.quick);
  return {
    model: `${MODEL.family} ${MODEL.preset}`,
    relay: relayBinary ? "native" : "typescript",
    ceiling,
    calibration,
    rows,
    degrade,
    cc,
  };
}

/**
 * Every link benchmark handoff's request but its prompt (here and in `link_matrix.ts`):
 * greedy-like sampling, 4 tokens, no logits probe.
 */
export function baseHandoffRequest(
  cluster: LocalCluster,
  timeoutMs: number,
): Omit<HandoffRequest, "prompt"> {
  return {
    prefill: cluster.prefill.peer,
    decode: cluster.decode.peer,
    generateTokens: 4,
    sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
    tenantId: "bench",
    probe: false,
    timeoutMs,
  };
}

/** The grid's points: every rate with the RTTs (fewer with `quick`) and losses. */
function _gridPoints(quick: boolean): LinkPoint[] {
  const points: LinkPoint[] = [];
  for (const rateBitsPerS of LINK_RATES) {
    for (const rttMs of quick ? [2, 10] : LINK_RTTS_MS) {
      for (const lossFraction of LINK_LOSSES) points.push({ rateBitsPerS, rttMs, lossFraction });
    }
  }
  return points;
}

/**
 * Calibration on the unshaped path, three disaggregated and colocated runs per prompt (the
 * warm-up run is discarded): node rates and tail costs into `recorders` and `costs`. Returns
 * the state bytes per prompt token as the runtime exported them (KV, history, framing).
 */
async function _calibrate(
  cluster: LocalCluster,
  base: Omit<HandoffRequest, "prompt">,
  prompts: string[],
  recorders: { prefiller: RateRecorder; decoder: RateRecorder },
  costs: HandoffCostRecorder,
): Promise<number> {
  let bytesPerToken = 0;
  for (const prompt of prompts) {
    for (let k = 0; k < 3; k++) {
      const d = await runHandoff(cluster.client, { ...base, prompt });
      const c = await runHandoff(cluster.client, { ...base, prompt, colocated: true });
      if (k === 0) continue;
      const t = d.telemetry;
      recorders.prefiller.recordHandoffPrefill(t);
      recorders.decoder.recordPrefill(t.promptTokens, c.ttftMs);
      // The continuation probe is one decode step at this depth: the tail's own term.
      if (t.probeMs) recorders.decoder.recordDecode(1, t.probeMs, t.promptTokens);
      costs.record(t, d.ttftMs, 0); // unshaped loopback: the link hides nothing
      // State bytes per prompt token as the runtime exported them (KV, history, framing).
      bytesPerToken = Math.max(bytesPerToken, t.totalBytes / t.promptTokens);
    }
  }
  return bytesPerToken;
}

/** Congestion control under loss, on the fastest rate the relay sustains here. */
async function _ccComparison(ceilingBitsPerS: number, relayBinary: string | null, quick: boolean) {
  const ccRate = [1e9, 400e6, 100e6, 20e6, 10e6].find((r) => r <= ceilingBitsPerS * 0.8) ??
    null;
  return ccRate === null ? [] : await runCcComparison({
    rateBitsPerS: ccRate,
    rttMs: 10,
    losses: [0, 0.001, 0.01],
    bytes: Math.max(4 << 20, Math.round(ccRate / 8)), // about a second at the line rate
    ceilingBitsPerS,
    relayBinary,
    repeats: quick ? 1 : 3,
  });
}

async function _runPoint(
  p: LinkPoint,
  promptTokens: number,
  x: _Ctx,
): Promise<LinkBenchRow[]> {
  const row = _emptyRow(p, promptTokens);
  const decode = x.cluster.decode.peer;
  let link: EmulatedLink;
  try {
    link = await openGridLink(x.relayBinary, decode, p, {
      ceilingBitsPerS: x.ceilingBitsPerS,
      seed: 7,
      queueBytesMin: 32 * 1024,
    });
  } catch (error) {
    row.refused = (error as Error).message.split(":")[0];
    return [row];
  }
  const rows: LinkBenchRow[] = [];
  try {
    const via = { ...decode, host: link.endpoint.hostname, port: link.endpoint.port };
    const links = new LinkEstimator();
    const monitor = new LinkMonitor(x.cluster.prefill.peer.nodeId, links, { pingsPerMeasure: 10 });
    const conns: PeerConnection[] = [];
    const conn = await _conn(x, via, conns);
    // The probe a live node sends, whatever the emulated rate (bench/link_probe_check.ts).
    const estimate = await monitor.measure(conn, DEFAULT_LINK_MONITOR_OPTIONS.probeBytes);
    // The measurement above ran from this process; it stands for the prefill worker's path.
    const pair = { from: x.cluster.prefill.peer.nodeId, to: decode.nodeId };
    const measured = links.estimate(pair, performance.now());
    row.measuredRttMs = measured?.rttMs ?? estimate?.rttMs ?? null;
    // Two runs: predicted from the probe, then from the first handoff's own transfer.
    for (let run = 0; run < 2; run++) {
      const e = links.estimate(pair, performance.now());
      const out: LinkBenchRow = {
        ...row,
        measuredBytesPerS: e?.bandwidthBytesPerS ?? null,
        bandwidthSource: e?.bandwidthSource ?? null,
      };
      rows.push(out);
      const t = await _predictAndRun(out, x, links, via, link);
      if (!t) break;
      const sample = handoffTransferSample(t, row.measuredRttMs ?? 0);
      if (sample) {
        out.handoffSampleBytesPerS = (sample.bytes / sample.ms) * 1000;
        // The handoff's own transfer replaces the probe as the newest bulk sample.
        links.forget(pair);
        for (let k = 0; k < 3; k++) await monitor.pingOnce(await _conn(x, via, conns));
        monitor.recordTransfer(decode.nodeId, sample.bytes, sample.ms);
      }
    }
    await conns[0]?.close();
  } finally {
    link.close();
  }
  return rows;
}

/** A point's row before anything is measured. */
function _emptyRow(p: LinkPoint, promptTokens: number): LinkBenchRow {
  return {
    ...p,
    promptTokens,
    refused: null,
    measuredRttMs: null,
    measuredBytesPerS: null,
    decision: null,
    predictedTtftMs: null,
    measuredTtftMs: null,
    predictedTailMs: null,
    measuredTailMs: null,
    stateBytes: null,
    relayDrops: null,
    bandwidthSource: null,
    achievedBytesPerS: null,
    measuredPrefillMs: null,
    handoffSampleBytesPerS: null,
    predictedProbeMs: null,
    measuredProbeMs: null,
  };
}

/** Predicts with the estimate as it stands, then runs one handoff through `via`. */
async function _predictAndRun(
  row: LinkBenchRow,
  x: _Ctx,
  links: LinkEstimator,
  via: PeerAddress,
  link: EmulatedLink,
): Promise<HandoffTelemetry | null> {
  const decode = x.cluster.decode.peer;
  {
    const promptTokens = row.promptTokens;
    const d = placeRequest({
      promptTokens,
      prefiller: {
        nodeId: x.cluster.prefill.peer.nodeId,
        rates: x.recorders.prefiller.rates(),
        hasRole: true,
      },
      decoder: {
        nodeId: decode.nodeId,
        rates: x.recorders.decoder.rates(),
        hasRole: true,
        freeBytes: 8 * 2 ** 30,
      },
      schemaShared: true,
      identityMatch: true,
      family: "dense",
      llamaBuild: "bench",
      state: { kvBytesPerToken: x.kvBytesPerToken, recurrentBytes: 0 },
      costs: x.costs.costs(),
      chunkTokens: RUNTIME_DEFAULTS.chunkTokens,
    }, { links, nowMs: performance.now(), certification: null });
    row.decision = `${d.placement}${x.certified ? "" : " (family not certified)"}: ` +
      d.reasons.filter((r) => r.code !== "chosen" && r.code !== "not-certified").map((r) => r.code)
        .join(",");
    row.predictedTtftMs = d.prediction?.ttftDisaggregatedMs ?? null;
    row.predictedTailMs = d.prediction?.commitTailMs ?? null;
    row.predictedProbeMs = d.estimates?.probeMs ?? null;
    const r = await runHandoff(x.cluster.client, { ...x.base, decode: via });
    if (r.placement !== "disaggregated") {
      row.refused = `handoff fell back: ${r.fallbackReason}`;
      return null;
    }
    row.measuredPrefillMs = r.telemetry.prefillMs;
    // The nodes report what they measured on every request they serve (rates, never constants).
    const t = r.telemetry;
    x.recorders.prefiller.recordHandoffPrefill(t);
    if (t.probeMs) x.recorders.decoder.recordDecode(1, t.probeMs, t.promptTokens);
    x.costs.record(
      t,
      r.ttftMs,
      d.estimates ? d.estimates.uncoveredKvMs + d.estimates.snapshotTransferMs : null,
    );
    row.measuredProbeMs = r.telemetry.probeMs;
    row.measuredTtftMs = r.ttftMs;
    row.measuredTailMs = r.telemetry.uncoveredTailMs;
    row.stateBytes = r.telemetry.totalBytes;
    row.achievedBytesPerS = r.telemetry.achievedBytesPerS;
    row.relayDrops = await link.drops();
    return r.telemetry;
  }
}

async function _conn(x: _Ctx, via: PeerAddress, conns: PeerConnection[]): Promise<PeerConnection> {
  if (!conns[0]) conns[0] = await x.cluster.client.connect(via);
  return conns[0];
}

async function _certification() {
  try {
    const p = `${cacheDir()}/certification.json`;
    return parseCertification(JSON.parse(await Deno.readTextFile(p)), p);
  } catch {
    return null;
  }
}
