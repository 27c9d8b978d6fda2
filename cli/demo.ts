/**
 * `demo`: the main job on the embedded default. Starts a decode worker and a prefill worker as
 * child processes on loopback with fresh identities that trust each other, runs one handoff of
 * a prompt on the default model (or --model), prints the generated text and a telemetry
 * summary, checks it against local generation, and stops the workers.
 */
import type { Command } from "commander";
import { formatTelemetry } from "../core/telemetry.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { Engine } from "../serve/engine.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";

import { defaultModelPath } from "./_default_model.ts";
import { addGpuLayersOption, intArg, readPrompt } from "./_options.ts";
import type { GpuLayersRequest } from "../ffi/mod.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";

const DEMO_PROMPT = "Phase-disaggregated serving moves the exact state of a prompt from the " +
  "machine that read it to the machine that will write the answer. ";

interface DemoFlags {
  model?: string;
  prompt?: string;
  promptFile?: string;
  n: number;
  gpuLayers: GpuLayersRequest;
  repeat: number;
}

export function register(program: Command): void {
  const demo = program
    .command("demo")
    .description("start a prefill and a decode worker on loopback and run one handoff")
    .option("--model <gguf>", "model file (default: the tiny hybrid test model)")
    .option("--prompt <text>", "prompt text (default: a built-in paragraph)")
    .option("--prompt-file <file>", "read the prompt from a file")
    .option("--repeat <k>", "repeat the prompt k times (a longer prompt)", intArg(1, 10_000), 24)
    .option("-n, --n <tokens>", "tokens to generate", intArg(1, 4096), 32);
  addGpuLayersOption(demo).action((flags: DemoFlags) => runDemo(flags));
}

function step(line: string): void {
  console.error(`demo: ${line}`);
}

async function runDemo(flags: DemoFlags): Promise<void> {
  const model = flags.model ?? await defaultModelPath();
  const base = flags.prompt !== undefined || flags.promptFile !== undefined
    ? await readPrompt(flags)
    : DEMO_PROMPT;
  const prompt = base.repeat(flags.repeat);
  step("starting a decode worker and a prefill worker on 127.0.0.1 (fresh identities)");
  const cluster = await startLocalCluster({
    args: ["--model", model, "--gpu-layers", String(flags.gpuLayers)],
  });
  try {
    step(
      `prefill ${cluster.prefill.peer.nodeId}@${cluster.prefill.peer.port}, ` +
        `decode ${cluster.decode.peer.nodeId}@${cluster.decode.peer.port}; running one handoff`,
    );
    const sampling = { temperature: 0, topK: 40, topP: 0.95, seed: 1 };
    const result = await runHandoff(cluster.client, {
      prefill: cluster.prefill.peer,
      decode: cluster.decode.peer,
      prompt,
      generateTokens: flags.n,
      sampling,
      tenantId: "demo",
      probe: false,
      timeoutMs: 120_000,
    });
    // The generated text is the demo's output (stdout); the steps go to stderr.
    await Deno.stdout.write(new TextEncoder().encode(`${result.text}\n`));
    step(
      `placement: ${result.placement}` +
        (result.fallbackReason ? ` (${result.fallbackReason})` : ""),
    );
    step(`telemetry: ${formatTelemetry(result.telemetry)}`);
    step(
      `client clock: first token after ${result.ttftMs.toFixed(0)} ms, done after ${
        result.e2eMs.toFixed(0)
      } ms`,
    );
    const local = await localTokens(model, prompt, flags.n, flags.gpuLayers);
    const same = local.length === result.tokens.length &&
      local.every((t, i) => t === result.tokens[i]);
    step(
      `same tokens as local generation on one machine: ${same ? "yes" : "NO"} ` +
        `(${result.tokens.length} tokens)`,
    );
    if (!same) throw new Error("The handoff's continuation differs from local generation");
  } finally {
    await cluster.stop();
    step("workers stopped");
  }
}

async function localTokens(
  model: string,
  prompt: string,
  n: number,
  gpuLayers: GpuLayersRequest,
): Promise<number[]> {
  using engine = await Engine.open({ ...RUNTIME_DEFAULTS, modelPath: model, gpuLayers });
  const tokens = engine.model.vocab.tokenize(prompt);
  const out: number[] = [];
  const first = await engine.prefill(tokens);
  for await (const s of engine.generate(first, n, { temperature: 0 }, { seed: 1, draws: 0 })) {
    out.push(s.token);
  }

  return out;
}
