/**
 * `correctness chaos`: handoffs with a worker killed (SIGKILL) at seeded points, alternating
 * prefill and decode (correctness/chaos.ts). Prints one line per trial (kill point, outcome,
 * placement and fallbacks, tokens equal to local generation, survivor back to idle) and exits
 * non-zero unless every trial passed.
 */
import type { Command } from "commander";
import { HandoffAbortedError } from "../core/errors.ts";
import { CHAOS_DEFAULTS, type ChaosTrial, noNodeDeadlineMs, runChaos } from "../correctness/mod.ts";
import { defaultModelPath } from "./_default_model.ts";
import { intArg } from "./_options.ts";

interface ChaosFlags {
  trials: number;
  seed: number;
  model?: string;
  promptTokens: number;
  n: number;
  chunkTokens: number;
  threads: number;
  json: boolean;
}

export function registerChaos(correctness: Command): void {
  correctness
    .command("chaos")
    .description(
      "handoffs between two worker processes with one killed (SIGKILL) at a seeded point of " +
        "each trial: every request completes with tokens equal to local generation",
    )
    .option("--trials <n>", "trials (alternating prefill and decode victims)", intArg(1, 1000), 12)
    .option("--seed <n>", "seed of the kill points", intArg(0, 0xffffffff), CHAOS_DEFAULTS.seed)
    .option("--model <gguf>", "model (default: the tiny hybrid test model)")
    .option("--prompt-tokens <n>", "prompt length", intArg(16, 65_536), CHAOS_DEFAULTS.promptTokens)
    .option("-n <n>", "tokens to generate", intArg(2, 4096), CHAOS_DEFAULTS.generateTokens)
    .option(
      "--chunk-tokens <n>",
      "prefill chunk (KV page) size: small gives a mid-stream kill pages to land between",
      intArg(1, 8192),
      CHAOS_DEFAULTS.chunkTokens,
    )
    .option("--threads <n>", "compute threads per worker", intArg(1, 256), CHAOS_DEFAULTS.threads)
    .option("--json", "print the trials as JSON", false)
    .action((flags: ChaosFlags) => runChaosCommand(flags));
}

async function runChaosCommand(flags: ChaosFlags): Promise<void> {
  const options = {
    ...CHAOS_DEFAULTS,
    trials: flags.trials,
    seed: flags.seed,
    modelPath: flags.model ?? await defaultModelPath(),
    promptTokens: flags.promptTokens,
    generateTokens: flags.n,
    chunkTokens: flags.chunkTokens,
    threads: flags.threads,
    log: flags.json ? undefined : (line: string) => console.log(line),
  };
  if (!flags.json) {
    console.log(
      `chaos: ${flags.trials} trials, seed ${flags.seed}, ${flags.promptTokens} prompt tokens, ` +
        `${flags.n} generated; no-node deadline ${noNodeDeadlineMs(options)} ms; ` +
        `survivor release bound ${options.releaseMs} ms`,
    );
  }
  const t0 = performance.now();
  const trials = await runChaos(options);
  const failed = trials.filter((t) => !t.ok);
  if (flags.json) {
    console.log(JSON.stringify({ options: { ...options, log: undefined }, trials }, null, 2));
  } else console.log(summary(trials, performance.now() - t0));
  if (failed.length > 0) {
    throw new HandoffAbortedError(
      "chaos",
      `${failed.length} of ${trials.length} chaos trials failed: ${
        failed.map((t) => `#${t.index}`).join(", ")
      }`,
      { hint: "rerun with the same --seed; SKIPPY_TEST_LOG has no effect here, see each line" },
    );
  }
}

function summary(trials: ChaosTrial[], wallMs: number): string {
  const kinds = new Map<string, number>();
  for (const t of trials) {
    for (const f of t.fallbacks.map((f) => f.split("@")[0])) kinds.set(f, (kinds.get(f) ?? 0) + 1);
  }
  const ok = trials.filter((t) => t.ok).length;
  const by = [...kinds].map(([k, n]) => `${k} x${n}`).join(", ") || "none";
  return `${ok}/${trials.length} trials passed in ${
    (wallMs / 1000).toFixed(1)
  } s; fallbacks: ${by}`;
}
