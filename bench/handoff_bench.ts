/**
 * Handoff across two worker processes on loopback, side by side with the colocated baseline
 * and raw QUIC, in one run: per prompt length, the handoff's achieved payload rate (bytes over
 * the summed write time) against a raw QUIC stream's, the overlap of transfer with prefill,
 * the uncovered tail, and TTFT disaggregated vs colocated (the decode worker prefilling the
 * prompt itself). On one 2-core machine both workers share the cores, so disaggregation
 * cannot win here: the point is the cost of the handoff, not a speedup.
 */
import { ensureModelFile } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { clusterRequest } from "./cluster_request.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { runTransportBench, type TransportBenchResult } from "./transport_bench.ts";
import { median, table } from "./stats.ts";
import { barChart, lineChart } from "./svg.ts";
import type { ReportSection } from "./report.ts";
import { type PayloadPathResult, runPayloadPathBench } from "./handoff_payload.ts";

export interface HandoffBenchRow {
  promptTokens: number;
  stateBytes: number;
  prefillMs: number;
  overlapFraction: number;
  stagedEarlyFraction: number;
  uncoveredTailMs: number;
  ttftDisaggregatedMs: number;
  ttftColocatedMs: number;
}

export interface HandoffBenchResult {
  family: string;
  preset: string;
  rows: HandoffBenchRow[];
  transport: TransportBenchResult;
  payload: PayloadPathResult;
}

export interface HandoffBenchOptions {
  modelDir: string;
  family?: string;
  preset?: string;
  promptTokens?: number[];
  repeats?: number;
}

const SENTENCE = "the quick brown fox jumps over the lazy dog and ";

export async function runHandoffBench(o: HandoffBenchOptions): Promise<HandoffBenchResult> {
  const family = o.family ?? "dense";
  const preset = o.preset ?? "tiny";
  const model = await ensureModelFile(o.modelDir, { family, preset, seed: 1 });
  const sizes = o.promptTokens ?? [1024, 4096, 16384];
  const perSentence = await tokensPerSentence(model);
  const ctx = Math.ceil((Math.max(...sizes) + 64) / 256) * 256;
  const transport = await runTransportBench({ transferMiB: 64, repeats: o.repeats ?? 3 });
  const payload = await runPayloadPathBench({
    modelPath: model,
    promptTokens: Math.max(...sizes),
    pageTokens: 2048,
    repeats: o.repeats ?? 3,
  });
  const cluster = await startLocalCluster({ args: ["--model", model, "--ctx", String(ctx)] });
  const rows: HandoffBenchRow[] = [];
  try {
    for (const size of sizes) {
      const prompt = SENTENCE.repeat(Math.max(1, Math.floor(size / perSentence)));
      const runs = [];
      for (let i = 0; i < (o.repeats ?? 3); i++) {
        const base = clusterRequest(cluster, prompt, { generateTokens: 4 });
        const d = await runHandoff(cluster.client, base);
        // Colocated baseline: the decode worker prefills the prompt itself.
        const c = await runHandoff(cluster.client, { ...base, colocated: true });
        runs.push({ d, c });
      }
      const t = runs.map((r) => r.d.telemetry);
      rows.push({
        promptTokens: runs[0].d.promptTokens,
        stateBytes: t[0].totalBytes,
        prefillMs: median(t.map((x) => x.prefillMs ?? NaN)),
        overlapFraction: median(t.map((x) => x.overlapFraction ?? 0)),
        stagedEarlyFraction: median(t.map((x) => x.stagedBeforePrefillEndFraction ?? 0)),
        uncoveredTailMs: median(t.map((x) => x.uncoveredTailMs ?? NaN)),
        ttftDisaggregatedMs: median(runs.map((r) => r.d.ttftMs)),
        ttftColocatedMs: median(runs.map((r) => r.c.ttftMs)),
      });
    }
  } finally {
    await cluster.stop();
  }
  return { family, preset, rows, transport, payload };
}

async function tokensPerSentence(model: string): Promise<number> {
  using m = await LlamaModel.load(loadLlama(), model);
  return m.vocab.tokenize(SENTENCE.repeat(100), false).length / 100;
}

/** The `handoff` section of `deno task bench`: table, notes and charts. */
export async function handoffSection(
  { quick, modelDir }: { quick: boolean; modelDir: string },
): Promise<ReportSection> {
  const r = await runHandoffBench({
    modelDir,
    promptTokens: quick ? [1024, 4096] : [1024, 4096, 16384],
    repeats: quick ? 1 : 3,
  });
  return {
    name: "handoff",
    rows: r,
    table: _handoffTable(r.rows),
    notes: _handoffNotes(r),
    charts: _handoffCharts(r),
  };
}

function _handoffTable(rows: HandoffBenchRow[]): string {
  return table(
    [
      "prompt",
      "state MB",
      "prefill ms",
      "overlap",
      "staged early",
      "tail ms",
      "TTFT disagg ms",
      "TTFT coloc ms",
    ],
    rows.map((x) => [
      x.promptTokens,
      x.stateBytes / 1e6,
      x.prefillMs,
      x.overlapFraction,
      x.stagedEarlyFraction,
      x.uncoveredTailMs,
      x.ttftDisaggregatedMs,
      x.ttftColocatedMs,
    ]),
  );
}

/** What the handoff section measured: the setup, the payload path and the transport's costs. */
function _handoffNotes(r: HandoffBenchResult): string[] {
  const p = r.payload;
  return [
    `${r.family} ${r.preset}; two worker processes and the client share 2 cores on loopback, so TTFT disaggregated cannot beat colocated here: this measures the handoff's cost.`,
    `Payload path (${
      (p.stateBytes / 1e6).toFixed(1)
    } MB of real KV pages, ${p.pages} pages of ${p.pageTokens} tokens: binding tag, framing, credit, CRC-32C check, append-import): ${
      p.payloadMBps.toFixed(0)
    } MB/s vs raw QUIC ${p.rawMBps.toFixed(0)} MB/s in the same run, ratio ${p.ratio.toFixed(2)}.`,
    `Authentication + capabilities: ${
      r.transport.authenticationMsMedian.toFixed(2)
    } ms per connection; framing encode ${r.transport.encodeMBps.toFixed(0)} MB/s, decode ${
      r.transport.decodeMBps.toFixed(0)
    } MB/s.`,
  ];
}

/** Payload path against raw QUIC, TTFT both ways, and the tail beside prefill by prompt. */
function _handoffCharts(r: HandoffBenchResult): Record<string, string> {
  const p = r.payload;
  return {
    "handoff-payload.svg": barChart(["raw QUIC", "handoff payload path"], [
      { name: "MB/s (median)", values: [p.rawMBps, p.payloadMBps] },
    ], { title: "Same bytes, same run", xLabel: "path", yLabel: "MB/s" }),
    "handoff-ttft.svg": barChart(r.rows.map((x) => String(x.promptTokens)), [
      { name: "disaggregated", values: r.rows.map((x) => x.ttftDisaggregatedMs) },
      { name: "colocated", values: r.rows.map((x) => x.ttftColocatedMs) },
    ], {
      title: "Time to first token on one 2-core machine",
      xLabel: "prompt tokens",
      yLabel: "ms",
    }),
    "handoff-tail.svg": lineChart([
      {
        name: "uncovered tail",
        points: r.rows.map((x) => ({ x: x.promptTokens, y: x.uncoveredTailMs })),
      },
      { name: "prefill", points: r.rows.map((x) => ({ x: x.promptTokens, y: x.prefillMs })) },
    ], {
      title: "Prefill time and the handoff's uncovered tail",
      xLabel: "prompt tokens",
      yLabel: "ms",
      logX: true,
    }),
  };
}
