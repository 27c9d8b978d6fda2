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
import { median } from "./stats.ts";
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
