/**
 * Continuous batching on one decode worker's shared context (serve/batch_pool.ts, the same
 * loop `serve --role decode` runs), in process: decode throughput in tokens/s summed over
 * streams at concurrency 1, 4 and 16, against the same requests decoded one at a time on a
 * context of their own, side by side in one run. Also the exactness under batching: the share
 * of greedy tokens (up to each stream's first divergence) and of logits rows bitwise equal to
 * the one-at-a-time run. Only the decode phase is timed (each wave's prompts are prefilled
 * first).
 */
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { ensureModelFile } from "../models/mod.ts";
import { SequencePool } from "../serve/batch_pool.ts";
import {
  type DecodeEngine,
  Engine,
  RUNTIME_DEFAULTS,
  type RuntimeConfig,
} from "../serve/engine.ts";
import { testTokens } from "../testing/models.ts";
import { median } from "./stats.ts";
import { type NodeLlamaCppResult, runNodeLlamaCpp } from "./node_llama_cpp.ts";

export interface BatchBenchRow {
  family: string;
  concurrency: number;
  requests: number;
  decodeTokensPerStream: number;
  threads: number;
  /** Decode tokens/s summed over streams: batched, and the same requests one at a time. */
  batchedTokensPerSec: number;
  sequentialTokensPerSec: number;
  ratio: number;
  /** The same per CPU-second of this process (NaN off Linux): independent of other load. */
  batchedTokensPerCpuSec: number;
  sequentialTokensPerCpuSec: number;
  cpuRatio: number;
  /** Greedy tokens equal to the one-at-a-time run (up to each stream's first divergence). */
  tokenAgreement: number;
  /** Logits rows bitwise equal to the one-at-a-time run. */
  logitsBitwiseEqual: number;
  /** Steps of the batch loop per decode token (1/concurrency when every step is full). */
  stepsPerDecodeToken: number;
  /**
   * node-llama-cpp on the same model, requests and llama.cpp build, `concurrency` sequences of
   * one context (null: skipped, see the section's notes): decode tokens/s summed over streams,
   * per CPU-second, ours batched over it, and greedy tokens equal to ours (batched, up to each
   * stream's first divergence).
   */
  nodeTokensPerSec: number | null;
  nodeTokensPerCpuSec: number | null;
  nodeRatio: number | null;
  /** Ours batched over node-llama-cpp, per CPU-second of each process (robust to other load). */
  nodeCpuRatio: number | null;
  nodeTokenAgreement: number | null;
}

interface Run {
  tokens: number[];
  logits: Float32Array[];
  decodeMs: number;
  /** CPU seconds this process used during the decode phase (null off Linux). */
  cpuS: number | null;
}

/**
 * CPU seconds this process has used (user + system, /proc/self/stat), or null where there is
 * no /proc. On a machine shared with other work, tokens per CPU-second do not depend on how
 * much of the machine the others take, as wall-clock tokens/s do.
 */
function cpuSeconds(): number | null {
  try {
    const stat = Deno.readTextFileSync("/proc/self/stat");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100; // clock ticks (USER_HZ = 100)
  } catch {
    return null;
  }
}

const GREEDY = { temperature: 0 };

async function decodeAll(
  engines: DecodeEngine[],
  prompts: Int32Array[],
  n: number,
): Promise<Run[]> {
  const firsts = await Promise.all(engines.map((e, i) => e.prefill(prompts[i])));
  const t0 = performance.now();
  const cpu0 = cpuSeconds();
  const runs = await Promise.all(engines.map(async (e, i) => {
    const run: Run = { tokens: [], logits: [], decodeMs: 0, cpuS: null };
    for await (const s of e.generate(firsts[i], n, GREEDY, { seed: 0, draws: 0 })) {
      run.tokens.push(s.token);
      run.logits.push(s.logits);
    }
    run.decodeMs = performance.now() - t0;
    return run;
  }));
  const cpu1 = cpuSeconds();
  // The wave's CPU time, on its first run (the others share it).
  if (cpu0 !== null && cpu1 !== null) runs[0].cpuS = cpu1 - cpu0;
  return runs;
}

/** Tokens per CPU-second over `runs` (the runs carrying their wave's CPU time). */
function perCpu(tokens: number, runs: Run[]): number {
  const cpu = runs.reduce((a, x) => a + (x.cpuS ?? NaN), 0);
  return cpu > 0 ? tokens / cpu : NaN;
}

function sameBits(a: Float32Array, b: Float32Array): boolean {
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  return x.length === y.length && x.every((v, i) => v === y[i]);
}

interface _BatchBenchOptions {
  modelDir: string;
  families: string[];
  concurrency: number[];
  requests: number;
  decodeTokens: number;
  repeats: number;
  threads: number;
  /** Also run node-llama-cpp side by side (installed into a scratch folder at bench time). */
  nodeLlamaCpp?: boolean;
}

export async function runBatchBench(
  o: _BatchBenchOptions,
): Promise<{ rows: BatchBenchRow[]; nodeSkipped: string | null }> {
  const rows: BatchBenchRow[] = [];
  let nodeSkipped: string | null = o.nodeLlamaCpp ? null : "not asked for";
  const lib = loadLlama();
  for (const family of o.families) {
    const modelPath = await ensureModelFile(o.modelDir, { family, preset: "tiny", seed: 0 });
    // One thread: on an oversubscribed machine a two-thread graph stalls at every barrier when
    // one thread is descheduled, which swamps what is measured (seen: 15 vs 1,000 tok/s).
    const config: RuntimeConfig = {
      ...RUNTIME_DEFAULTS,
      modelPath,
      nCtx: 1024,
      threads: o.threads,
    };
    using model = await LlamaModel.load(lib, modelPath);
    // Mixed prompt lengths, 32 to 480 tokens.
    const prompts = Array.from(
      { length: o.requests },
      (_, i) => testTokens(32 + ((i * 97) % 449), 950, i),
    );
    // One at a time, each on a context of its own: the baseline and the exactness reference.
    // Measured right before each batched run (same load on a shared machine), medians of both.
    using own = await Engine.open(config, model);
    // Same model, requests, threads and per-sequence context in node-llama-cpp.
    const node: NodeLlamaCppResult = o.nodeLlamaCpp && nodeSkipped === null
      ? await runNodeLlamaCpp({
        modelPath,
        prompts,
        concurrency: o.concurrency,
        decodeTokens: o.decodeTokens,
        threads: config.threads,
        contextSize: config.nCtx,
        repeats: o.repeats,
      })
      : { ok: false, skipped: nodeSkipped ?? "skipped" };
    if (!node.ok) nodeSkipped = node.skipped;
    for (const c of o.concurrency) {
      rows.push(await _concurrencyRow(o, family, c, { model, config, prompts, own, node }));
    }
  }
  return { rows, nodeSkipped };
}

/** What every concurrency of one family shares. */
interface _FamilyRun {
  model: LlamaModel;
  config: RuntimeConfig;
  prompts: Int32Array[];
  /** The engine that decodes one request at a time (the reference). */
  own: Engine;
  node: NodeLlamaCppResult;
}

/** Agreement with the one-at-a-time reference, summed over every batched run. */
interface _Agreement {
  agree: number;
  bitwise: number;
  total: number;
}

/** Every prompt one at a time on `own`: tokens/s, tokens per CPU-second, and the runs. */
async function _oneAtATime(
  own: Engine,
  prompts: Int32Array[],
  decodeTokens: number,
): Promise<{ rate: number; cpuRate: number; runs: Run[] }> {
  const runs: Run[] = [];
  for (const p of prompts) {
    await own.wipe();
    runs.push((await decodeAll([own], [p], decodeTokens))[0]);
  }
  const ms = runs.reduce((a, x) => a + x.decodeMs, 0);
  const tokens = runs.reduce((a, x) => a + x.tokens.length, 0);
  return { rate: tokens / (ms / 1000), cpuRate: perCpu(tokens, runs), runs };
}

/** One concurrency: repeats of the reference then the batched waves, as a table row. */
async function _concurrencyRow(
  o: _BatchBenchOptions,
  family: string,
  c: number,
  f: _FamilyRun,
): Promise<BatchBenchRow> {
  const batchedTokens: number[][] = [];
  using pool = await SequencePool.open(f.model, f.config, {
    sequencesMax: c,
    stepTokensMax: 512,
  });
  const rates: number[] = [];
  const seqRates: number[] = [];
  const cpuRates: number[] = [];
  const seqCpuRates: number[] = [];
  const a: _Agreement = { agree: 0, bitwise: 0, total: 0 };
  const decodeTokens0 = pool.loop.totals.decodeTokens;
  const steps0 = pool.loop.totals.steps;
  for (let r = 0; r < o.repeats; r++) {
    const reference = await _oneAtATime(f.own, f.prompts, o.decodeTokens);
    seqRates.push(reference.rate);
    seqCpuRates.push(reference.cpuRate);
    const batched = await _batchedRepeat(pool, c, f.prompts, o.decodeTokens, reference.runs, {
      batchedTokens,
      agreement: a,
    });
    rates.push(batched.rate);
    cpuRates.push(batched.cpuRate);
  }
  const steps = pool.loop.totals.steps - steps0;
  const decoded = pool.loop.totals.decodeTokens - decodeTokens0;
  return {
    family,
    concurrency: c,
    requests: f.prompts.length,
    decodeTokensPerStream: o.decodeTokens,
    threads: f.config.threads,
    batchedTokensPerSec: median(rates),
    sequentialTokensPerSec: median(seqRates),
    ratio: median(rates) / median(seqRates),
    batchedTokensPerCpuSec: median(cpuRates),
    sequentialTokensPerCpuSec: median(seqCpuRates),
    cpuRatio: median(cpuRates) / median(seqCpuRates),
    tokenAgreement: a.agree / a.total,
    logitsBitwiseEqual: a.bitwise / a.total,
    stepsPerDecodeToken: steps / Math.max(1, decoded),
    ...nodeColumns(f.node, c, median(rates), median(cpuRates), batchedTokens),
  };
}

/**
 * Every prompt once through the pool in waves of `c` sessions; each run's tokens land in
 * `into.batchedTokens` and its agreement with the reference in `into.agreement`.
 */
async function _batchedRepeat(
  pool: SequencePool,
  c: number,
  prompts: Int32Array[],
  decodeTokens: number,
  reference: Run[],
  into: { batchedTokens: number[][]; agreement: _Agreement },
): Promise<{ rate: number; cpuRate: number }> {
  const a = into.agreement;
  let tokens = 0;
  let ms = 0;
  const waves: Run[] = [];
  for (let w = 0; w < prompts.length; w += c) {
    const wave = prompts.slice(w, w + c);
    const sessions = await Promise.all(wave.map(() => pool.tryAcquire()));
    const runs = await decodeAll(sessions.map((s) => s!.engine), wave, decodeTokens);
    ms += Math.max(...runs.map((x) => x.decodeMs));
    waves.push(runs[0]);
    for (const [i, run] of runs.entries()) {
      const ref = reference[w + i];
      into.batchedTokens[w + i] = run.tokens;
      tokens += run.tokens.length;
      const diverged = run.tokens.findIndex((t, k) => t !== ref.tokens[k]);
      a.agree += diverged < 0 ? run.tokens.length : diverged;
      a.bitwise += run.logits.filter((l, k) => sameBits(l, ref.logits[k])).length;
      a.total += run.tokens.length;
    }
    for (const s of sessions) pool.release(s!);
    await pool.drained();
  }
  return { rate: tokens / (ms / 1000), cpuRate: perCpu(tokens, waves) };
}

function nodeColumns(
  node: NodeLlamaCppResult,
  concurrency: number,
  batchedTokensPerSec: number,
  batchedTokensPerCpuSec: number,
  ours: number[][],
): Pick<
  BatchBenchRow,
  "nodeTokensPerSec" | "nodeTokensPerCpuSec" | "nodeRatio" | "nodeCpuRatio" | "nodeTokenAgreement"
> {
  const row = node.ok ? node.rows.find((r) => r.concurrency === concurrency) : undefined;
  if (!row) {
    return {
      nodeTokensPerSec: null,
      nodeTokensPerCpuSec: null,
      nodeRatio: null,
      nodeCpuRatio: null,
      nodeTokenAgreement: null,
    };
  }
  let agree = 0;
  let total = 0;
  row.tokens.forEach((theirs, i) => {
    const mine = ours[i] ?? [];
    const n = Math.min(theirs.length, mine.length);
    const diverged = theirs.slice(0, n).findIndex((t, k) => t !== mine[k]);
    agree += diverged < 0 ? n : diverged;
    total += n;
  });
  return {
    nodeTokensPerSec: row.tokensPerSec,
    nodeTokensPerCpuSec: row.tokensPerCpuSec,
    nodeRatio: batchedTokensPerSec / row.tokensPerSec,
    nodeCpuRatio: batchedTokensPerCpuSec / row.tokensPerCpuSec,
    nodeTokenAgreement: total > 0 ? agree / total : null,
  };
}
