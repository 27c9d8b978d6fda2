/**
 * The prefix cache through a two-process handoff, as issue #12 asks: two workers as child
 * processes (the prefill worker with `--prefix-cache-bytes-max`), a cold request of `--prompt`
 * tokens, then a request sharing `--shared` of it from the same tenant, and the same request
 * from another tenant (which must not hit: the cold reference). Probe mode: every step's logits
 * digest is compared. Prints, per family: cached/computed tokens, prefill ms cold vs warm,
 * tokens and digests equal.
 *
 * `deno run -A --unstable-net bench/prefix_run.ts [--families dense,iswa,recurrent,hybrid,hybrid-moe-mtp] [--prompt 4096]
 * [--shared 0.75]`
 */
import { parseArgs } from "node:util";
import { runHandoff } from "../serve/coordinator.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { ensureModelFile, syntheticTokens } from "../models/mod.ts";
import { cacheDir } from "../cli/paths.ts";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";

const USAGE =
  "usage: prefix_run.ts [--families hybrid,dense] [--prompt 4096] [--shared 0.75] [--steps 16]";
const FAMILIES = ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"] as const;
type Family = typeof FAMILIES[number];

export async function promptOf(modelPath: string, tokens: number, seed: number): Promise<string> {
  using model = await LlamaModel.load(loadLlama(), modelPath);
  const n = model.vocab.nTokens;
  // The synthetic sequence, rotated by `seed`: different seeds give different texts.
  const ids = syntheticTokens(tokens, n).map((t) => 3 + ((t - 3 + seed * 101) % (n - 3)));
  return model.vocab.detokenize(ids);
}

async function runFamily(family: Family, promptTokens: number, shared: number, steps: number) {
  const modelPath = await ensureModelFile(`${cacheDir()}/models`, {
    family,
    preset: "tiny",
    seed: 0,
  });
  const sharedTokens = Math.floor(promptTokens * shared);
  const head = await promptOf(modelPath, sharedTokens, 1);
  const coldPrompt = head + await promptOf(modelPath, promptTokens - sharedTokens, 2);
  const warmPrompt = head + await promptOf(modelPath, promptTokens - sharedTokens, 3);
  const nCtx = Math.ceil((promptTokens * 1.3 + steps + 64) / 256) * 256;
  const cluster = await startLocalCluster({
    args: ["--model", modelPath, "--ctx", String(nCtx)],
    prefillArgs: ["--prefix-cache-bytes-max", String(512 << 20), "--prefix-checkpoints-max", "4"],
  });
  try {
    const run = (prompt: string, tenantId: string) =>
      runHandoff(cluster.client, {
        prefill: cluster.prefill.peer,
        decode: cluster.decode.peer,
        prompt,
        generateTokens: steps,
        sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
        tenantId,
        probe: true,
        timeoutMs: 120_000,
      });
    await run(coldPrompt, "tenant-a"); // fills the cache for tenant-a
    const reference = await run(warmPrompt, "tenant-b"); // another tenant: computed cold
    const warm = await run(warmPrompt, "tenant-a");
    const same = (a: string[] | number[], b: string[] | number[]) =>
      a.length === b.length && a.every((x, i) => x === b[i]);
    return {
      family,
      promptTokens: warm.telemetry.promptTokens,
      headSyntheticTokens: sharedTokens,
      cold: { cached: reference.telemetry.cachedTokens, prefillMs: reference.telemetry.prefillMs },
      warm: { cached: warm.telemetry.cachedTokens, prefillMs: warm.telemetry.prefillMs },
      placement: [reference.placement, warm.placement],
      tokensEqual: same(warm.tokens, reference.tokens),
      logitsDigestsEqual: warm.logitsSha256.length === steps &&
        same(warm.logitsSha256, reference.logitsSha256),
    };
  } finally {
    await cluster.stop();
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      families: { type: "string", default: "hybrid,dense" },
      prompt: { type: "string", default: "4096" },
      shared: { type: "string", default: "0.75" },
      steps: { type: "string", default: "16" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) return console.log(USAGE);
  const families = values.families.split(",") as Family[];
  const prompt = Number(values.prompt);
  const shared = Number(values.shared);
  const steps = Number(values.steps);
  if (
    families.some((f) => !FAMILIES.includes(f)) || !(prompt > 0) || !(shared > 0 && shared < 1) ||
    !(steps > 0)
  ) {
    throw new Error(`bad flag value; ${USAGE}`);
  }
  for (const family of families) {
    console.log(JSON.stringify(await runFamily(family, prompt, shared, steps)));
  }
}

if (import.meta.main) await main();
