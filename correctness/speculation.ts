/**
 * Decode modes of the state-handoff harness: target-only, MTP, suffix and MTP + suffix. Per
 * case a prefiller side A prefills a constructed self-repeating prompt (the suffix proposer
 * must fire on it), hands the state to a fresh decoder context B on another model instance
 * (the real staged import), and both continue with the same speculative loop. The verdict
 * needs every token after the handoff to equal the colocated run's and target-only greedy
 * decoding's, and every MTP draft's logits after the handoff to equal the colocated ones bit
 * for bit. Speculation runs on per-session contexts.
 */
import { type Family, familySpec, type Preset } from "../models/mod.ts";
import { Engine, RUNTIME_DEFAULTS, type RuntimeConfig } from "../serve/engine.ts";
import {
  SPECULATION_DEFAULTS,
  type SpeculationReport,
  SpeculativeDecoder,
} from "../serve/speculative.ts";
import type { SpeculationMode } from "../core/speculation.ts";
import { selfRepeatingPrompt } from "../testing/speculation_prompt.ts";
import {
  adoptHandoff,
  DecoderModel,
  openHandoff,
  prefillSide,
  Side,
  stageAndCommit,
} from "./state_handoff.ts";

export const DECODE_MODES = ["target-only", "mtp", "suffix", "mtp+suffix"] as const;
export type DecodeMode = typeof DECODE_MODES[number];

export interface SpeculationCase {
  family: Family;
  preset: Preset;
  promptTokens: number;
  chunkTokens: number;
  mode: DecodeMode;
}

export interface SpeculationCaseResult extends SpeculationCase {
  /** `n/a`: an MTP mode on a family without MTP. */
  verdict: "exact" | "differs" | "n/a";
  ok: boolean;
  /** Tokens after the handoff equal the colocated run's. */
  tokensEqual: boolean;
  /** ...and target-only greedy decoding's. */
  targetEqual: boolean;
  /** Every MTP draft's logits equal colocated vs after the handoff (null: no MTP drafts). */
  draftsBitwise: boolean | null;
  colocated: SpeculationReport | null;
  moved: SpeculationReport | null;
  steps: number;
  /** Tokens per second of the loop after the first token (benchmarks only; null: n/a). */
  colocatedTokensPerSec: number | null;
  movedTokensPerSec: number | null;
  /** Tokens per CPU-second of the same loops (null: no `cpuSeconds` clock given, or n/a). */
  colocatedTokensPerCpuSec: number | null;
  movedTokensPerCpuSec: number | null;
}

/** What one side's speculative continuation produced. */
export interface SpeculativeContinuation {
  tokens: number[];
  /** MTP draft logits per round, as bytes. */
  drafts: Uint8Array[][];
  report: SpeculationReport;
  /** Wall time of the loop after the first token's step (for benchmarks, never asserted). */
  loopMs: number;
  /** CPU seconds of the same loop, when a clock was given (benchmarks only). */
  loopCpuSec: number | null;
}

function bytesOf(f: Float32Array): Uint8Array {
  return new Uint8Array(f.buffer, f.byteOffset, f.byteLength).slice();
}

function modeOf(mode: DecodeMode): SpeculationMode {
  return mode === "target-only" ? "none" : mode;
}

/**
 * Decodes the first token alone (colocated: its own step; on a decoder this is the probe's
 * decode), then continues `steps - 1` tokens with the speculative loop.
 */
export async function continueSpeculating(
  side: Side,
  prompt: Int32Array,
  first: number,
  steps: number,
  cpuSeconds: () => number | null = () => null,
): Promise<SpeculativeContinuation> {
  const logits = await side.engine.step(first);
  const drafts: Uint8Array[][] = [];
  const decoder = new SpeculativeDecoder(
    side.engine,
    side.draft,
    [...prompt, first],
    { temperature: 0 },
    side.engine.config.speculation ?? SPECULATION_DEFAULTS,
    { onMtpDraft: (_t, rows) => drafts.push(rows.map(bytesOf)) },
  );
  const tokens = [first];
  const cpu0 = cpuSeconds();
  const t0 = performance.now();
  for await (const s of decoder.generate(logits, steps - 1, { seed: 0, draws: 0 })) {
    tokens.push(s.token);
  }
  const loopMs = performance.now() - t0;
  const cpu1 = cpuSeconds();
  const loopCpuSec = cpu0 === null || cpu1 === null ? null : cpu1 - cpu0;
  return { tokens, drafts, report: decoder.report, loopMs, loopCpuSec };
}

export interface SpeculationOptions {
  steps: number;
  modelFor: (family: Family, preset: Preset) => Promise<string>;
  threads?: number;
  digestCacheFile?: string;
  /**
   * Tokens of the target's own continuation copied into the prompt's head (default 8): what
   * the suffix proposer can match once generation reaches the repeat.
   */
  copyTokens?: number;
  /** CPU seconds used by this process so far (benchmarks: tokens per CPU-second). */
  cpuSeconds?: () => number | null;
}

export async function runSpeculationCase(
  c: SpeculationCase,
  options: SpeculationOptions,
): Promise<SpeculationCaseResult> {
  const hasMtp = familySpec(c.family, c.preset).nextnLayers > 0;
  const base = {
    ...c,
    tokensEqual: false,
    targetEqual: false,
    draftsBitwise: null,
    colocated: null,
    moved: null,
    steps: options.steps,
    colocatedTokensPerSec: null,
    movedTokensPerSec: null,
    colocatedTokensPerCpuSec: null,
    movedTokensPerCpuSec: null,
  };
  if (!hasMtp && (c.mode === "mtp" || c.mode === "mtp+suffix")) {
    return { ...base, verdict: "n/a", ok: true };
  }
  const config = caseConfig(c, options, hasMtp, await options.modelFor(c.family, c.preset));
  const copyTokens = options.copyTokens ?? 8;
  using a = await Side.open(config, { digestCacheFile: options.digestCacheFile });
  const prompt = await selfRepeatingPrompt(a.engine, {
    copyTokens,
    bodyTokens: Math.max(16, c.promptTokens - copyTokens - 2),
  });
  const want = await targetOnlyTokens(config, prompt, options.steps);
  const { state, firstToken } = await prefillSide(a, prompt);
  using dm = await DecoderModel.load(config);
  using b = await dm.openSide(options.digestCacheFile);
  const imp = await openHandoff(b, a.identity, prompt.length, options.steps);
  const { mtpHidden } = await stageAndCommit(imp, state);
  adoptHandoff(b, prompt.length, mtpHidden);
  const clock = options.cpuSeconds;
  const colocated = await continueSpeculating(a, prompt, firstToken, options.steps, clock);
  const moved = await continueSpeculating(b, prompt, firstToken, options.steps, clock);
  return { ...base, ...compareContinuations(colocated, moved, want) };
}

/** The case's runtime: a context that fits prompt and steps, MTP when the family has it. */
function caseConfig(
  c: SpeculationCase,
  options: SpeculationOptions,
  hasMtp: boolean,
  modelPath: string,
): RuntimeConfig {
  return {
    ...RUNTIME_DEFAULTS,
    modelPath,
    nCtx: Math.ceil((c.promptTokens + options.steps + 64) / 256) * 256,
    chunkTokens: c.chunkTokens,
    threads: options.threads ?? RUNTIME_DEFAULTS.threads,
    mtp: hasMtp,
    speculation: { ...SPECULATION_DEFAULTS, mode: modeOf(c.mode) },
  };
}

/** Target-only greedy decoding of `prompt` on a plain engine: what every mode must produce. */
async function targetOnlyTokens(
  config: RuntimeConfig,
  prompt: Int32Array,
  steps: number,
): Promise<number[]> {
  const want: number[] = [];
  using plain = await Engine.open({ ...config, speculation: undefined, mtp: false });
  const logits = await plain.prefill(prompt);
  const greedy = { temperature: 0 };
  for await (const s of plain.generate(logits, steps, greedy, { seed: 0, draws: 0 })) {
    want.push(s.token);
  }
  return want;
}

/** The verdict: the moved run against the colocated run and target-only tokens, and rates. */
function compareContinuations(
  colocated: SpeculativeContinuation,
  moved: SpeculativeContinuation,
  want: number[],
): Omit<SpeculationCaseResult, keyof SpeculationCase | "steps"> {
  const same = (x: number[], y: number[]) => x.length === y.length && x.every((t, i) => t === y[i]);
  const tokensEqual = same(moved.tokens, colocated.tokens);
  const targetEqual = same(moved.tokens, want);
  const draftsBitwise = moved.drafts.length === 0 && colocated.drafts.length === 0
    ? null
    : JSON.stringify(moved.drafts.map((r) => r.map((x) => Array.from(x)))) ===
      JSON.stringify(colocated.drafts.map((r) => r.map((x) => Array.from(x))));
  const ok = tokensEqual && targetEqual && draftsBitwise !== false &&
    moved.report.fallback === null;
  return {
    verdict: ok ? "exact" : "differs",
    ok,
    tokensEqual,
    targetEqual,
    draftsBitwise,
    colocated: colocated.report,
    moved: moved.report,
    colocatedTokensPerSec: (colocated.tokens.length - 1) / (colocated.loopMs / 1000),
    movedTokensPerSec: (moved.tokens.length - 1) / (moved.loopMs / 1000),
    colocatedTokensPerCpuSec: perCpuSec(colocated),
    movedTokensPerCpuSec: perCpuSec(moved),
  };
}

function perCpuSec(c: SpeculativeContinuation): number | null {
  return c.loopCpuSec === null || c.loopCpuSec <= 0 ? null : (c.tokens.length - 1) / c.loopCpuSec;
}

/** One printable row per case: verdict and acceptance per source after the handoff. */
export function formatSpeculationRow(r: SpeculationCaseResult): string {
  const head = `${r.family} ${r.promptTokens} tok ${r.mode}`.padEnd(36);
  if (r.verdict === "n/a") return `${head} n/a (no MTP layers)`;
  const c = r.moved?.counters;
  const acc = c
    ? `mtp ${c.mtpAccepted}/${c.mtpDrafted} suffix ${c.suffixAccepted}/${c.suffixDrafted} ` +
      `in ${c.rounds} rounds`
    : "";
  const drafts = r.draftsBitwise === null
    ? ""
    : r.draftsBitwise
    ? " drafts bitwise"
    : " DRAFTS DIFFER";
  const fallback = r.moved?.fallback ? ` fallback ${r.moved.fallback}` : "";
  return `${head} ${r.ok ? "ok  " : "FAIL"} tokens ${
    r.tokensEqual && r.targetEqual ? "equal" : "DIFFER"
  }` +
    `${drafts} ${acc}${fallback}`;
}
