/**
 * `demo`: the main job on the embedded default. Starts a decode worker and a prefill worker as
 * child processes on loopback with fresh identities that trust each other, runs one handoff of
 * a prompt on the default model (or --model), prints the generated text and a telemetry
 * summary, checks it against local generation, and stops the workers. A fallback to colocated
 * generation is accepted (the demo still shows the answer) but always printed with its reason.
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
import { GENERATE_TOKENS_MAX } from "../serve/messages.ts";
import { hostUdpBufferAdvice } from "../transport/mod.ts";

const DEMO_PROMPT = "Phase-disaggregated serving moves the exact state of a prompt from the " +
  "machine that read it to the machine that will write the answer. ";

interface DemoFlags {
  model?: string;
  prompt?: string;
  promptFile?: string;
  n: number;
  gpuLayers: GpuLayersRequest;
  repeat: number;
  timeoutMs: number;
}

export function register(program: Command): void {
  const demo = program
    .command("demo")
    .description("start a prefill and a decode worker on loopback and run one handoff")
    .option("--model <gguf>", "model file (default: the tiny hybrid test model)")
    .option("--prompt <text>", "prompt text (default: a built-in paragraph)")
    .option("--prompt-file <file>", "read the prompt from a file")
    .option("--repeat <k>", "repeat the prompt k times (a longer prompt)", intArg(1, 10_000), 24)
    .option("-n, --n <tokens>", "tokens to generate", intArg(1, GENERATE_TOKENS_MAX), 32)
    .option(
      "--timeout-ms <ms>",
      "fail when the workers report no progress for this long (not a cap on the length)",
      intArg(1, 86_400_000),
      120_000,
    );
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
  const nCtx = contextFor(prompt, flags.n);
  step("starting a decode worker and a prefill worker on 127.0.0.1 (fresh identities)");
  // What each worker says at start (serve), said once here: the workers' stderr is their log.
  const udpAdvice = await hostUdpBufferAdvice();
  if (udpAdvice) step(udpAdvice);
  const cluster = await startLocalCluster({
    args: ["--model", model, "--ctx", String(nCtx), "--gpu-layers", String(flags.gpuLayers)],
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
      timeoutMs: flags.timeoutMs,
    });
    // The generated text is the demo's output (stdout); the steps go to stderr.
    await Deno.stdout.write(new TextEncoder().encode(`${result.text}\n`));
    step(
      result.fallbackReason === null
        ? `placement: ${result.placement}`
        : `placement: ${result.placement}: the handoff fell back (${result.fallbackReason})`,
    );
    step(`telemetry: ${formatTelemetry(result.telemetry)}`);
    step(
      `client clock: first token after ${result.ttftMs.toFixed(0)} ms, done after ${
        result.e2eMs.toFixed(0)
      } ms` + (result.firstTokenAfterPrefillMs === null
        ? ""
        : `, first token ${result.firstTokenAfterPrefillMs.toFixed(1)} ms after prefill ended`),
    );
    const local = await localTokens(model, prompt, flags.n, nCtx, flags.gpuLayers);
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

/**
 * A context that holds the prompt and the generation: a token is at least one byte of text,
 * so the prompt's UTF-8 length bounds its tokens. Never below the default.
 */
function contextFor(prompt: string, n: number): number {
  const needed = new TextEncoder().encode(prompt).length + n + 64;
  return Math.max(RUNTIME_DEFAULTS.nCtx, Math.ceil(needed / 256) * 256);
}

async function localTokens(
  model: string,
  prompt: string,
  n: number,
  nCtx: number,
  gpuLayers: GpuLayersRequest,
): Promise<number[]> {
  using engine = await Engine.open({ ...RUNTIME_DEFAULTS, modelPath: model, nCtx, gpuLayers });
  const tokens = engine.model.vocab.tokenize(prompt);
  const out: number[] = [];
  const first = await engine.prefill(tokens);
  for await (const s of engine.generate(first, n, { temperature: 0 }, { seed: 1, draws: 0 })) {
    out.push(s.token);
  }

  return out;
}
