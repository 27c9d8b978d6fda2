/**
 * The two-process handoff matrix: per family, a prefill and a decode worker as `serve` child
 * processes on loopback (real llama.cpp, real QUIC); per prompt length, one handoff in probe
 * mode compared with local generation in this process. A case passes when the continuation has
 * the same tokens and bitwise-equal logits (SHA-256 per step) and, with enough prefill chunks,
 * KV pages were staged at the decoder before the last chunk finished (the overlap).
 *
 * `correctness handoff` runs it from the CLI (the long 32K cases live there, not in the test
 * suite); `process_handoff_test.ts` runs it at sizes that finish in seconds.
 *
 * No wall-clock bound applies to the compute: each handoff and the decoder's reservation (which
 * spans the prefill) carry only `hangMs`, a watchdog meant to catch a true hang, never to time
 * a slow machine. With the 60 s default reservation, a 32K dense prefill on a loaded two-core
 * machine outlived it and the case fell back to colocated (reservation-expired).
 */
import { createHash } from "node:crypto";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import type { Family } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";

export interface ProcessCase {
  family: Family;
  /** Prompt length asked for; the prompt built has between 90% and 100% of it. */
  promptTokens: number;
}

export interface ProcessMatrixOptions {
  /** Path of the model file of a family (made on first use by the caller). */
  modelFor: (family: Family) => Promise<string>;
  /** Tokens per prefill chunk and KV page on the prefill worker. */
  chunkTokens: number;
  /** Compute threads per process, both sides (part of the numerical identity). */
  threads: number;
  /** Greedy tokens compared after the handoff. */
  generateTokens: number;
  /** Watchdog per handoff: long enough that only a hang trips it, never a slow machine. */
  hangMs: number;
  /**
   * Assert the overlap only from this many prefill chunks on: with fewer, the last chunk may
   * rightly finish before the first credit comes back.
   */
  overlapChunksMin: number;
  /**
   * The prefill worker's largest state chunk (`serve --state-chunk-bytes`); unset: the
   * default frame-sized chunk. Small values cut KV pages, snapshot layers and the SWA cache
   * into many pieces; every chunk sent must then be within it.
   */
  stateChunkBytes?: number;
}

export const PROCESS_DEFAULTS = {
  chunkTokens: 512,
  threads: 2,
  generateTokens: 12,
  hangMs: 600_000,
  overlapChunksMin: 8,
} as const;

export interface ProcessCaseResult extends ProcessCase {
  /** Prompt tokens the workers saw. */
  actualPromptTokens: number;
  chunkTokens: number;
  chunks: number;
  placement: "disaggregated" | "colocated";
  tokensEqual: boolean;
  logitsEqual: boolean;
  /** Share of KV bytes staged at the decoder before the last prefill chunk finished. */
  stagedEarlyFraction: number | null;
  /** Whether the overlap was required of this case (enough chunks). */
  overlapRequired: boolean;
  /** State chunks the prefiller sent, and the largest payload among them. */
  chunksSent: number | null;
  chunkBytesMaxSent: number | null;
  /** Coordinator's clock, reported only; never asserted. */
  e2eMs: number;
  ok: boolean;
  /** Why the case failed; never content. */
  detail: string | null;
}

const SENTENCE = "the quick brown fox jumps over the lazy dog and ";
const SAMPLING = { temperature: 0, topK: 40, topP: 0.95, seed: 1 };

/** A prompt of about `tokens` tokens for the model's tokenizer (no content that matters). */
export async function promptOf(model: string, tokens: number): Promise<string> {
  using m = await LlamaModel.load(loadLlama(), model);
  const perSentence = m.vocab.tokenize(SENTENCE.repeat(100), false).length / 100;
  return SENTENCE.repeat(Math.floor((tokens - 2) / perSentence));
}

/** The context each worker gets for a family's cases: the longest prompt plus generation. */
export function contextTokensFor(cases: readonly ProcessCase[], generateTokens: number): number {
  const longest = Math.max(...cases.map((c) => c.promptTokens));
  return Math.ceil((longest + generateTokens + 16) / 256) * 256;
}

interface LocalRun {
  tokens: number[];
  digests: string[];
  promptTokens: number;
}

async function localRun(
  model: string,
  prompt: string,
  nCtx: number,
  options: ProcessMatrixOptions,
): Promise<LocalRun> {
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: model,
    nCtx,
    chunkTokens: options.chunkTokens,
    threads: options.threads,
  });
  const tokens = engine.model.vocab.tokenize(prompt);
  const first = await engine.prefill(tokens);
  const out: LocalRun = { tokens: [], digests: [], promptTokens: tokens.length };
  const steps = engine.generate(first, options.generateTokens, { temperature: 0 }, {
    seed: SAMPLING.seed,
    draws: 0,
  });
  for await (const s of steps) {
    out.tokens.push(s.token);
    const bytes = new Uint8Array(s.logits.buffer, s.logits.byteOffset, s.logits.byteLength);
    out.digests.push(createHash("sha256").update(bytes).digest("hex"));
  }
  return out;
}

/** Runs `cases` (grouped by family: one pair of workers per family) and reports each. */
export async function runProcessMatrix(
  cases: readonly ProcessCase[],
  options: ProcessMatrixOptions,
  onCase?: (index: number, c: ProcessCase) => void,
): Promise<ProcessCaseResult[]> {
  const results: ProcessCaseResult[] = [];
  const families = [...new Set(cases.map((c) => c.family))];
  for (const family of families) {
    const mine = cases.filter((c) => c.family === family);
    const model = await options.modelFor(family);
    const nCtx = contextTokensFor(mine, options.generateTokens);
    const cluster = await startLocalCluster({
      args: [
        "--model",
        model,
        "--ctx",
        String(nCtx),
        "--chunk-tokens",
        String(options.chunkTokens),
        "--threads",
        String(options.threads),
        // The decoder's reservation covers the whole prefill, which is compute: give it the
        // hang watchdog, so a slow machine cannot turn a case into a colocated fallback.
        "--reservation-ms",
        String(options.hangMs),
        ...(options.stateChunkBytes
          ? ["--state-chunk-bytes", String(options.stateChunkBytes)]
          : []),
      ],
    });
    try {
      for (const c of mine) {
        onCase?.(results.length, c);
        const prompt = await promptOf(model, c.promptTokens);
        const remote = await runHandoff(cluster.client, {
          prefill: cluster.prefill.peer,
          decode: cluster.decode.peer,
          prompt,
          generateTokens: options.generateTokens,
          sampling: SAMPLING,
          tenantId: "correctness",
          probe: true,
          timeoutMs: options.hangMs,
        });
        const local = await localRun(model, prompt, nCtx, options);
        results.push(judge(c, remote, local, options));
      }
    } finally {
      await cluster.stop();
    }
  }
  return results;
}

function judge(
  c: ProcessCase,
  remote: Awaited<ReturnType<typeof runHandoff>>,
  local: LocalRun,
  options: ProcessMatrixOptions,
): ProcessCaseResult {
  const chunks = Math.ceil(remote.promptTokens / options.chunkTokens);
  const staged = remote.telemetry.stagedBeforePrefillEndFraction;
  const overlapRequired = chunks >= options.overlapChunksMin;
  const r: Omit<ProcessCaseResult, "ok" | "detail"> = {
    ...c,
    actualPromptTokens: remote.promptTokens,
    chunkTokens: options.chunkTokens,
    chunks,
    placement: remote.placement,
    tokensEqual: sameList(remote.tokens, local.tokens),
    logitsEqual: sameList(remote.logitsSha256, local.digests),
    stagedEarlyFraction: staged,
    overlapRequired,
    chunksSent: remote.telemetry.chunksSent,
    chunkBytesMaxSent: remote.telemetry.chunkBytesMaxSent,
    e2eMs: remote.e2eMs,
  };
  const chunkMax = options.stateChunkBytes;
  const failures = [
    r.placement !== "disaggregated" && `ran ${r.placement}: ${remote.fallbackReason}`,
    remote.promptTokens !== local.promptTokens &&
    `prompt tokens differ: ${remote.promptTokens} handed off, ${local.promptTokens} local`,
    (remote.promptTokens < c.promptTokens * 0.9 || remote.promptTokens > c.promptTokens) &&
    `prompt of ${remote.promptTokens} tokens for ${c.promptTokens} asked`,
    !r.tokensEqual && "tokens differ from local generation",
    !r.logitsEqual && "logits differ from local generation",
    overlapRequired && !(staged !== null && staged > 0) &&
    `no KV page staged before the last of ${chunks} prefill chunks finished`,
    chunkMax !== undefined && r.placement === "disaggregated" &&
    !(r.chunkBytesMaxSent !== null && r.chunkBytesMaxSent <= chunkMax) &&
    `a state chunk of ${r.chunkBytesMaxSent} bytes, over --state-chunk-bytes ${chunkMax}`,
  ].filter((f): f is string => typeof f === "string");
  return { ...r, ok: failures.length === 0, detail: failures.join("; ") || null };
}

function sameList<T>(a: readonly T[], b: readonly T[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
