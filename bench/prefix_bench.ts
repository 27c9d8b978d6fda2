/**
 * The `prefix` section of `deno task bench` (issue #12): time to first token against the
 * prefix-hit rate, through a two-process handoff (`serve` child processes, the prefill worker
 * with `--prefix-cache-bytes-max`), on `hybrid` (tiny) and `lab-state` (Nemotron 3 Super's state
 * geometry), and the memory one checkpoint costs.
 *
 * Per repeat and hit rate h (0, 50, 90%): a seed request puts a prompt of N tokens in the cache
 * with a checkpoint exactly where its first h·N tokens end (passed as a user-turn end, as the
 * API does for chat), then the measured request, of the same tenant, repeats those h·N tokens
 * and continues differently: it restores h·N tokens and computes the rest (h = 0: nothing is
 * shared). The hit rate shown is the measured one (cached / prompt tokens from telemetry).
 * TTFT is on the client's clock; medians over repeats, hit rates interleaved within a repeat.
 *
 * Checkpoint memory is measured in process on the same model: the bytes of the snapshot the
 * cache keeps (`llama_state_seq_get_data` of the sequence) at two lengths, split into the
 * fixed recurrent part and KV per token.
 */
import { ensureModelFile } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { syntheticTokens } from "../models/mod.ts";
import { promptOf } from "./prefix_run.ts";
import { median, table } from "./stats.ts";
import { lineChart } from "./svg.ts";
import type { ReportSection } from "./report.ts";

export interface PrefixBenchRow {
  model: string;
  promptTokens: number;
  /** The hit rate asked for, and the one measured (cached / prompt tokens). */
  targetHitRate: number;
  hitRate: number;
  cachedTokens: number;
  ttftMs: number;
  prefillMs: number;
  repeats: number;
}

export interface CheckpointCost {
  model: string;
  /** Bytes of a checkpoint with no tokens: the recurrent state (plus headers). */
  fixedBytes: number;
  kvBytesPerToken: number;
  /** Measured bytes of checkpoints at these lengths. */
  measured: { tokens: number; bytes: number }[];
}

interface BenchModel {
  label: string;
  preset: "tiny" | "lab-state";
  promptTokens: number;
}

const SAMPLING = { temperature: 0, topK: 40, topP: 0.95, seed: 1 };

type _Handoff = Awaited<ReturnType<typeof runHandoff>>;

export async function runPrefixBench(o: {
  modelDir: string;
  models: BenchModel[];
  hitRates: number[];
  repeats: number;
}): Promise<{ rows: PrefixBenchRow[]; costs: CheckpointCost[] }> {
  const rows: PrefixBenchRow[] = [];
  const costs: CheckpointCost[] = [];
  for (const m of o.models) {
    const modelPath = await ensureModelFile(o.modelDir, {
      family: "hybrid",
      preset: m.preset,
      seed: 1,
    });
    costs.push(await checkpointCost(m.label, modelPath));
    const runs = await _measureHitRates(modelPath, m.promptTokens, o.hitRates, o.repeats);
    for (const h of o.hitRates) rows.push(_hitRateRow(m.label, h, runs.get(h)!));
  }
  return { rows, costs };
}

/**
 * The measured handoffs per hit rate on one model, each after its seed request, on a cluster
 * whose prefill worker keeps one checkpoint; hit rates interleaved within each repeat.
 */
async function _measureHitRates(
  modelPath: string,
  n: number,
  hitRates: number[],
  repeats: number,
): Promise<Map<number, _Handoff[]>> {
  const cluster = await startLocalCluster({
    args: [
      "--model",
      modelPath,
      "--ctx",
      String(Math.ceil((n * 1.3 + 64) / 256) * 256),
      // A lab-state chunk on a loaded two-core machine can outlast the default wait.
      "--reservation-ms",
      "120000",
    ],
    prefillArgs: [
      "--prefix-cache-bytes-max",
      String(2 ** 30),
      "--prefix-checkpoints-max",
      "1",
    ],
  });
  const runs = new Map<number, _Handoff[]>();
  try {
    const run = (prompt: string, turnEnds?: number[]) =>
      runHandoff(cluster.client, {
        prefill: cluster.prefill.peer,
        decode: cluster.decode.peer,
        prompt,
        generateTokens: 2,
        sampling: SAMPLING,
        tenantId: "bench",
        probe: false,
        timeoutMs: 600_000,
        ...(turnEnds ? { turnEnds } : {}),
      });
    let seed = 10;
    for (let r = 0; r < repeats; r++) {
      for (const h of hitRates) {
        const shared = Math.round(n * h);
        const head = shared > 0 ? await promptOf(modelPath, shared, seed++) : "";
        const seedPrompt = head + await promptOf(modelPath, n - shared, seed++);
        await run(seedPrompt, head ? [head.length] : undefined);
        const measured = await run(head + await promptOf(modelPath, n - shared, seed++));
        if (measured.placement !== "disaggregated") {
          throw new Error(`prefix bench handoff fell back: ${measured.fallbackReason}`);
        }
        runs.set(h, [...runs.get(h) ?? [], measured]);
      }
    }
  } finally {
    await cluster.stop();
  }
  return runs;
}

/** One hit rate's row: medians over its repeats. */
function _hitRateRow(model: string, h: number, rs: _Handoff[]): PrefixBenchRow {
  const t = rs.map((x) => x.telemetry);
  return {
    model,
    promptTokens: median(t.map((x) => x.promptTokens)),
    targetHitRate: h,
    hitRate: median(t.map((x) => x.cachedTokens / x.promptTokens)),
    cachedTokens: median(t.map((x) => x.cachedTokens)),
    ttftMs: median(rs.map((x) => x.ttftMs)),
    prefillMs: median(t.map((x) => x.prefillMs ?? NaN)),
    repeats: rs.length,
  };
}

/** The bytes the cache keeps for one checkpoint, measured at two lengths on `modelPath`. */
async function checkpointCost(label: string, modelPath: string): Promise<CheckpointCost> {
  const config = { ...RUNTIME_DEFAULTS, modelPath, nCtx: 512, chunkTokens: 128 };
  using engine = await Engine.open(config);
  const tokens = syntheticTokens(128, engine.model.vocab.nTokens);
  const measured: { tokens: number; bytes: number }[] = [];
  await engine.prefill(tokens.subarray(0, 64));
  measured.push({ tokens: 64, bytes: (await engine.ctx.stateSeqGet(0)).byteLength });
  await engine.prefill(tokens.subarray(64));
  measured.push({ tokens: 128, bytes: (await engine.ctx.stateSeqGet(0)).byteLength });
  const kvBytesPerToken = (measured[1].bytes - measured[0].bytes) / 64;
  return {
    model: label,
    fixedBytes: measured[0].bytes - 64 * kvBytesPerToken,
    kvBytesPerToken,
    measured,
  };
}

const MiB = 1024 * 1024;

/** The `prefix` section: TTFT vs hit rate, and what a checkpoint costs. */
export async function prefixSection(
  o: { quick: boolean; modelDir: string },
): Promise<ReportSection> {
  const r = await runPrefixBench({
    modelDir: o.modelDir,
    models: [
      { label: "hybrid", preset: "tiny", promptTokens: o.quick ? 1024 : 2048 },
      // lab-state prefills ~50 tok/s on this machine's two cores: a short prompt.
      { label: "lab-state", preset: "lab-state", promptTokens: 512 },
    ],
    hitRates: [0, 0.5, 0.9],
    repeats: o.quick ? 1 : 3,
  });
  const cold = (model: string) => r.rows.find((x) => x.model === model && x.targetHitRate === 0)!;
  return {
    name: "prefix",
    rows: r,
    table: [
      table(
        ["model", "prompt", "hit rate", "cached tokens", "TTFT ms", "x cold TTFT", "prefill ms"],
        r.rows.map((x) => [
          x.model,
          x.promptTokens,
          x.hitRate,
          x.cachedTokens,
          x.ttftMs,
          x.ttftMs / cold(x.model).ttftMs,
          x.prefillMs,
        ]),
      ),
      "",
      table(
        ["model", "checkpoint MiB at 0 tokens", "KV B/token", "measured"],
        r.costs.map((c) => [
          c.model,
          c.fixedBytes / MiB,
          c.kvBytesPerToken,
          c.measured.map((m) => `${m.tokens} tok: ${(m.bytes / MiB).toFixed(2)} MiB`).join(", "),
        ]),
      ),
    ].join("\n"),
    notes: [
      "Two `serve` processes on loopback (--reservation-ms 120000; prefill worker: --prefix-cache-bytes-max 1 GiB, --prefix-checkpoints-max 1), the client in the bench process. Per repeat and hit rate: a seed request leaves a checkpoint where its first h·N tokens end (passed as a user-turn end, as the API does for chat), then the measured request of the same tenant shares those tokens and continues differently. Hit rate: measured cached / prompt tokens. TTFT on the client's clock; medians over repeats; x cold TTFT: ratio to the 0% row of the same model in the same run.",
      "Checkpoint memory: bytes of the snapshot the cache keeps (the whole sequence state: KV of its tokens plus the recurrent conv/SSM state at its end), measured in process at 64 and 128 tokens; the fixed part is the recurrent state (lab-state: Nemotron 3 Super's 172,687,360 B, about 165 MiB), the rest grows with the tokens. So a 1 GiB budget holds at most 6 lab-state checkpoints.",
    ],
    charts: {
      "prefix-ttft.svg": lineChart(
        [...new Set(r.rows.map((x) => x.model))].map((model) => ({
          name: model,
          points: r.rows.filter((x) => x.model === model).map((x) => ({
            x: Math.round(x.hitRate * 100),
            y: x.ttftMs / cold(model).ttftMs,
          })),
        })),
        {
          title: "TTFT relative to a cold prompt, against the prefix-hit rate",
          xLabel: "prefix-hit rate (%)",
          yLabel: "x cold TTFT",
        },
      ),
    },
  };
}
