/**
 * The handoff's tail on `lab-state` (Nemotron 3 Super's state geometry: 8,192 B/token of KV,
 * 172,687,360 B of recurrent state), side by side with its physical floors, in one run:
 *
 * - floor: (last page + recurrent snapshot + MTP state) / raw QUIC rate + import + 1 RTT, the
 *   raw rate measured in the same run, import the decoder's import step after the last byte,
 *   RTT a control round trip (StatsRequest) between the same processes;
 * - layer floor: (last Mamba layer's state + last page) / raw QUIC rate + import + 1 RTT, what
 *   remains when every other layer left while the last chunk still computed (layer capture).
 *
 * The measured tail is prefill end -> CommitAck on the prefill worker's clock. It contains
 * the decoder's continuation probe (one decode step, which also yields token 2's logits), so
 * the ratio is taken on the tail without that step; both are reported. TTFT is on the client's
 * clock beside the prefill time: the first token leaves at prefill end. Two workers and the
 * client share two cores here, so sending while computing competes with the prefill: prefill
 * time is shown with layer capture on and off.
 */
import { countUdpReceiveDrops, type UdpDropCount } from "../transport/mod.ts";
import { ensureModelFile } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { type LocalCluster, startLocalCluster } from "../serve/local_cluster.ts";
import { clusterRequest } from "./cluster_request.ts";
import { queryStats } from "../serve/stats.ts";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { runTransportBench } from "./transport_bench.ts";
import { type PayloadPathResult, runPayloadPathBench } from "./handoff_payload.ts";
import { median, table } from "./stats.ts";

/**
 * The prefill worker's capture: `on` sends the recurrent layers and the last page while the
 * last chunk computes; `layers` only the layers (`--last-page-capture off`: the page leaves
 * after the chunk); `off` neither.
 */
export type CaptureMode = "on" | "layers" | "off";

export interface LabTailRow {
  promptTokens: number;
  layerCapture: boolean;
  capture: CaptureMode;
  /** Whether the workers asked for huge pages (`--huge-pages`, ffi/huge_pages.ts). */
  hugePages: boolean;
  /** `cold`: the process pair's first handoff; `warm`: the ones after it. */
  workers: "cold" | "warm";
  prefillMs: number;
  ttftMs: number;
  firstTokenAfterPrefillMs: number | null;
  /** Prefill end -> CommitAck (prefill worker's clock). */
  tailMs: number;
  /** The decoder's continuation probe (one decode step). */
  probeMs: number;
  /** `tailMs - probeMs`: the transfer, import and commit round trip. */
  tailToReadyMs: number;
  /**
   * How long the decoder's probe result waited for the prefiller's probe digest, which now
   * follows the manifest (0: the digest was there first). Part of `tailToReadyMs`.
   */
  probeWaitMs: number;
  repeats: number;
  lastImportMs: number;
  tailBytes: number;
  lastLayerBytes: number;
  floorMs: number;
  layerFloorMs: number;
  /**
   * The layer floor at the faster of this run's two raw QUIC measurements (the transport
   * section's 128 MiB streams, and the payload section's raw baseline of real pages), which
   * can differ by 2x here: the stricter reading of "the raw rate".
   */
  layerFloorFastestMs: number;
}

export interface LabTailResult {
  /** llama.cpp threads per worker (null: the runtime default). */
  workerThreads: number | null;
  rawMBps: number;
  rttMs: number;
  payload: PayloadPathResult;
  rows: LabTailRow[];
  /**
   * The host's default UDP receive buffer and the datagrams its kernel dropped for a full one
   * during the run (Linux `RcvbufErrors`, host-wide; null where unreadable; absent before run 27).
   */
  udp?: UdpDropCount;
}

const MAMBA_LAYERS = 40;
const CHUNK_TOKENS = 512;
/** The prompt is this sentence repeated (lab-state has a random vocabulary). */
export const LAB_SENTENCE = "the quick brown fox jumps over the lazy dog and ";
/**
 * Worker flags of a lab-state tail measurement: a loaded two-core machine can stretch one probe
 * decode to seconds, and a commit timeout there would end the run in a fallback.
 */
export const LAB_TIMEOUT_ARGS = ["--commit-timeout-ms", "120000", "--lease-ms", "180000"];

/** One lab-state handoff of `prompt` on `cluster`, greedy, 2 tokens; throws on a fallback. */
export async function labHandoff(cluster: LocalCluster, prompt: string) {
  const r = await runHandoff(cluster.client, clusterRequest(cluster, prompt));
  if (r.placement !== "disaggregated") {
    throw new Error(`lab-state handoff fell back: ${r.fallbackReason}`);
  }
  return r;
}

export async function runLabTailBench(o: {
  modelDir: string;
  promptTokens: number[];
  /** Prompt lengths also run with layer capture off. */
  captureOffTokens: number[];
  /** Prompt lengths also run with the layers captured but the last page sent after prefill. */
  pageAfterTokens: number[];
  /** Prompt lengths also run with capture on and `--huge-pages off` (4 KiB pages). */
  smallPagesTokens: number[];
  /** Prompt whose real KV pages the payload-path measurement moves. */
  payloadTokens: number;
  repeats: number;
  /** Repeats of the payload path vs raw QUIC (paired, alternating order). */
  payloadRepeats: number;
  /** Prompts at least this long run once (an 8K prefill takes minutes here). */
  onceFromTokens: number;
  /**
   * llama.cpp threads per worker (undefined: the runtime default). Both workers share this
   * machine's cores: one thread each keeps the prefiller's probe decode and the decoder's
   * from putting four spinning threads on two cores when they overlap.
   */
  workerThreads?: number;
}): Promise<LabTailResult> {
  const model = await ensureModelFile(o.modelDir, {
    family: "hybrid",
    preset: "lab-state",
    seed: 1,
  });
  const udpDrops = await countUdpReceiveDrops();
  const transport = await runTransportBench({ transferMiB: 128, repeats: o.repeats });
  const payload = await runPayloadPathBench({
    modelPath: model,
    promptTokens: o.payloadTokens,
    pageTokens: CHUNK_TOKENS,
    repeats: o.payloadRepeats,
  });
  const perSentence = await tokensPerSentence(model);
  const ctx = Math.ceil((Math.max(...o.promptTokens) + 256) / 256) * 256;
  const rows: LabTailRow[] = [];
  const rates = {
    raw: transport.rawMBpsMedian,
    fastest: Math.max(transport.rawMBpsMedian, payload.rawMBps),
  };
  const m: _LabRun = { model, ctx, perSentence, rates, rttMs: NaN };
  const modes: [CaptureMode, number[], boolean][] = [
    ["on", o.promptTokens, true],
    ["on", o.smallPagesTokens, false],
    ["layers", o.pageAfterTokens, true],
    ["off", o.captureOffTokens, true],
  ];
  for (const [mode, sizes, hugePages] of modes) {
    if (sizes.length === 0) continue;
    rows.push(...await _runCaptureMode(o, m, mode, sizes, hugePages));
  }
  return {
    workerThreads: o.workerThreads ?? null,
    rawMBps: transport.rawMBpsMedian,
    rttMs: m.rttMs,
    payload,
    rows,
    udp: await udpDrops(),
  };
}

/** What every capture mode's run shares; `rttMs` is measured by the first (capture on, huge pages). */
interface _LabRun {
  model: string;
  ctx: number;
  perSentence: number;
  rates: { raw: number; fastest: number };
  rttMs: number;
}

/** One capture mode on its own process pair: its cold row, then a warm row per prompt size. */
async function _runCaptureMode(
  o: { repeats: number; onceFromTokens: number; workerThreads?: number },
  m: _LabRun,
  mode: CaptureMode,
  sizes: number[],
  hugePages: boolean,
): Promise<LabTailRow[]> {
  const rows: LabTailRow[] = [];
  const cluster = await startLocalCluster({
    args: [
      ...["--model", m.model, "--ctx", String(m.ctx)],
      ...["--layer-capture", mode === "off" ? "off" : "on"],
      ...["--last-page-capture", mode === "on" ? "on" : "off"],
      ...["--huge-pages", hugePages ? "on" : "off"],
      ...LAB_TIMEOUT_ARGS,
      ...(o.workerThreads ? ["--threads", String(o.workerThreads)] : []),
    ],
  });
  // At most `size` tokens, so the last chunk is (nearly) full: the layer capture hides the
  // snapshot behind that chunk's compute, and a 1-token last chunk has none.
  const promptOf = (size: number) =>
    LAB_SENTENCE.repeat(Math.max(1, Math.floor((size - 16) / m.perSentence)));
  try {
    if (mode === "on" && hugePages) m.rttMs = await controlRoundTripMs(cluster);
    // The pair's first handoff, on cold workers (fresh buffers and first decodes): its own
    // row, so the measured rows are on warm workers, as in serving.
    const cold = await labHandoff(cluster, promptOf(Math.min(...sizes)));
    rows.push({ ...row([cold], mode, hugePages, m.rates, m.rttMs), workers: "cold" });
    for (const size of sizes) {
      const runs = [];
      const repeats = size >= o.onceFromTokens ? 1 : o.repeats;
      for (let i = 0; i < repeats; i++) runs.push(await labHandoff(cluster, promptOf(size)));
      rows.push(row(runs, mode, hugePages, m.rates, m.rttMs));
    }
  } finally {
    await cluster.stop();
  }
  return rows;
}

function row(
  runs: Awaited<ReturnType<typeof runHandoff>>[],
  capture: CaptureMode,
  hugePages: boolean,
  rates: { raw: number; fastest: number },
  rttMs: number,
): LabTailRow {
  const t = runs.map((r) => r.telemetry);
  const n = runs[0].promptTokens;
  const b = t[0].bytesByComponent;
  const lastPageTokens = n - Math.floor((n - 1) / CHUNK_TOKENS) * CHUNK_TOKENS;
  const lastPage = (b["kv-page"] ?? 0) * (lastPageTokens / n);
  const recurrent = (b.conv ?? 0) + (b.ssm ?? 0);
  const mtp = (b["mtp-hidden"] ?? 0) + (b["mtp-kv"] ?? 0) * (lastPageTokens / n);
  const tailBytes = lastPage + recurrent + mtp;
  const lastLayerBytes = recurrent / MAMBA_LAYERS;
  const lastImportMs = median(t.map((x) => x.lastImportMs));
  const wireMs = (bytes: number, mbps = rates.raw) => bytes / (mbps * 1e6) * 1000;
  const tailMs = median(t.map((x) => x.uncoveredTailMs ?? NaN));
  const probeMs = median(t.map((x) => x.probeMs ?? 0));
  return {
    promptTokens: n,
    layerCapture: capture !== "off",
    capture,
    hugePages,
    workers: "warm",
    prefillMs: median(t.map((x) => x.prefillMs ?? NaN)),
    ttftMs: median(runs.map((r) => r.ttftMs)),
    firstTokenAfterPrefillMs: median(runs.map((r) => r.firstTokenAfterPrefillMs ?? NaN)),
    tailMs,
    probeMs,
    tailToReadyMs: median(t.map((x) => (x.uncoveredTailMs ?? NaN) - (x.probeMs ?? 0))),
    probeWaitMs: median(t.map((x) => x.probeWaitMs ?? NaN)),
    repeats: runs.length,
    lastImportMs,
    tailBytes,
    lastLayerBytes,
    floorMs: wireMs(tailBytes) + lastImportMs + rttMs,
    layerFloorMs: wireMs(lastLayerBytes + lastPage + mtp) + lastImportMs + rttMs,
    layerFloorFastestMs: wireMs(lastLayerBytes + lastPage + mtp, rates.fastest) + lastImportMs +
      rttMs,
  };
}

/** Median of a few StatsRequest round trips to the decode worker: an upper bound on RTT. */
async function controlRoundTripMs(
  cluster: LocalCluster,
): Promise<number> {
  const peer = await cluster.client.connect(cluster.decode.peer);
  try {
    const times: number[] = [];
    for (let i = 0; i < 7; i++) {
      const t0 = performance.now();
      await queryStats(peer);
      times.push(performance.now() - t0);
    }
    return median(times.slice(2));
  } finally {
    await peer.close();
  }
}

async function tokensPerSentence(model: string): Promise<number> {
  using m = await LlamaModel.load(loadLlama(), model);
  return m.vocab.tokenize(LAB_SENTENCE.repeat(100), false).length / 100;
}

/**
 * The `payload` section: the handoff payload path vs raw QUIC on lab-state's real KV pages
 * alone (the `lab` section measures it too, before its tails), paired repeats in one run.
 */
export async function payloadSection(o: { quick: boolean; modelDir: string }) {
  const model = await ensureModelFile(o.modelDir, {
    family: "hybrid",
    preset: "lab-state",
    seed: 1,
  });
  const p = await runPayloadPathBench({
    modelPath: model,
    promptTokens: o.quick ? 1024 : 2048,
    pageTokens: CHUNK_TOKENS,
    repeats: o.quick ? 3 : 9,
  });
  return {
    name: "payload",
    rows: p,
    table: table(
      ["repeat", "payload path MB/s", "raw QUIC MB/s", "ratio"],
      p.ratios.map((ratio, i) => [i + 1, p.payloadMBpsRuns[i], p.rawMBpsRuns[i], ratio]),
    ),
    notes: [
      `lab-state hybrid, ${p.pages} real KV pages of ${p.pageTokens} tokens (${
        (p.stateBytes / 1e6).toFixed(1)
      } MB) per transfer: binding tag, framing, credit, CRC-32C check, append-import into a second context, against a raw QUIC stream moving the same bytes in pages of the same size; sender and receiver in one process on loopback. Each repeat runs both paths back to back, in alternating order. Median ratio ${
        p.ratio.toFixed(2)
      } (medians: payload path ${p.payloadMBps.toFixed(0)} MB/s, raw ${
        p.rawMBps.toFixed(0)
      } MB/s).`,
    ],
    charts: {},
  };
}
