/**
 * Options shared by the commands that load a model: the runtime's capacity and numerics.
 * Every numerics option has a fixed default (never derived from the machine) and is reported
 * in `--json` output, because thread count, flash attention, K/V type and CPU variant all
 * change logits.
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { InputFileError, UsageError } from "../core/errors.ts";
import { GGML_TYPE, type GpuLayersRequest, type KvType } from "../ffi/mod.ts";
import { CHUNK_TOKENS_MAX, RUNTIME_DEFAULTS, type RuntimeConfig } from "../serve/engine.ts";
import { defaultModelPath } from "./_default_model.ts";

/** Parser for an integer flag within [min, max]. */
export function intArg(min: number, max: number): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (!/^-?\d+$/.test(value.trim()) || !Number.isSafeInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`expected an integer from ${min} to ${max}, got "${value}"`);
    }
    return n;
  };
}

/** Parser for a number flag within [min, max]. */
export function numberArg(min: number, max: number): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (value.trim() === "" || !Number.isFinite(n) || n < min || n > max) {
      throw new InvalidArgumentError(`expected a number from ${min} to ${max}, got "${value}"`);
    }
    return n;
  };
}

const KV_TYPES = Object.keys(GGML_TYPE);

export interface RuntimeFlags {
  model?: string;
  ctx: number;
  chunkTokens: number;
  threads: number;
  flashAttn: boolean;
  kvType: KvType;
  cpuVariant?: string;
  gpuLayers: GpuLayersRequest;
  mtp?: boolean;
  hugePages: "on" | "off";
}

/** Parser for `--gpu-layers <n|all|auto>`. */
export function gpuLayersArg(value: string): GpuLayersRequest {
  const v = value.trim();
  if (v === "all" || v === "auto") return v;
  return intArg(0, 1 << 16)(v);
}

/** Adds `--gpu-layers` (also used by commands without the other runtime options). */
export function addGpuLayersOption(cmd: Command): Command {
  return cmd.option(
    "--gpu-layers <n|all>",
    "layers offloaded to the GPU (changes numerics; default auto: all when the llama.cpp " +
      "build has a GPU device, else 0)",
    gpuLayersArg,
    "auto" as GpuLayersRequest,
  );
}

/**
 * Adds --model, --ctx, --chunk-tokens, --threads, --flash-attn, --kv-type, --cpu-variant,
 * --gpu-layers, --mtp, --huge-pages.
 */
export function addRuntimeOptions(cmd: Command): Command {
  const runtime = cmd
    .option("--model <gguf>", "model file (default: the tiny hybrid test model, made on first use)")
    .option("--ctx <tokens>", "context size in tokens", intArg(16, 1 << 20), RUNTIME_DEFAULTS.nCtx)
    .option(
      "--chunk-tokens <n>",
      "prompt tokens per prefill chunk",
      intArg(1, CHUNK_TOKENS_MAX),
      RUNTIME_DEFAULTS.chunkTokens,
    )
    .option(
      "--threads <n>",
      "compute threads (changes numerics)",
      intArg(1, 256),
      RUNTIME_DEFAULTS.threads,
    )
    .option("--flash-attn", "enable flash attention (changes numerics)", false)
    .addOption(
      new Option("--kv-type <type>", "K and V cache type (changes numerics)")
        .choices(KV_TYPES)
        .default(RUNTIME_DEFAULTS.typeK),
    )
    .option("--cpu-variant <name>", "CPU backend variant (default: best for this machine)");
  return addGpuLayersOption(runtime)
    .option("--mtp", "load the model's MTP layers (default: when the model has them)")
    .option("--no-mtp", "do not load the model's MTP layers")
    .addOption(
      new Option(
        "--huge-pages <on|off>",
        "Linux: weights and context buffers in transparent huge pages (numerics unchanged)",
      ).choices(["on", "off"]).default("on"),
    );
}

/** Turns parsed flags into a runtime config, making the default model if needed. */
export async function runtimeConfigFrom(flags: RuntimeFlags): Promise<RuntimeConfig> {
  return {
    modelPath: flags.model ?? await defaultModelPath(),
    nCtx: flags.ctx,
    chunkTokens: flags.chunkTokens,
    threads: flags.threads,
    flashAttention: flags.flashAttn,
    typeK: flags.kvType,
    typeV: flags.kvType,
    cpuVariant: flags.cpuVariant,
    gpuLayers: flags.gpuLayers,
    mtp: flags.mtp,
    hugePages: flags.hugePages !== "off",
  };
}

/** Reads the prompt from --prompt or --prompt-file (exactly one). */
export async function readPrompt(flags: { prompt?: string; promptFile?: string }): Promise<string> {
  if ((flags.prompt === undefined) === (flags.promptFile === undefined)) {
    throw new UsageError("Give exactly one of --prompt <text> or --prompt-file <file>");
  }
  if (flags.prompt !== undefined) return flags.prompt;
  try {
    return await Deno.readTextFile(flags.promptFile!);
  } catch (cause) {
    throw new InputFileError(`Cannot read prompt file "${flags.promptFile}"`, {
      hint: "check the path",
      cause,
    });
  }
}

/** What `addRequestOptions` parses: the prompt, how many tokens, and sampling. */
export interface RequestFlags {
  prompt?: string;
  promptFile?: string;
  n: number;
  seed: number;
  temperature: number;
  topK: number;
  topP: number;
}

/** Adds --prompt, --prompt-file, -n, --seed, --temperature, --top-k, --top-p. */
export function addRequestOptions(cmd: Command, tokensMin = 0): Command {
  return cmd
    .option("--prompt <text>", "prompt text")
    .option("--prompt-file <file>", "read the prompt from a file")
    .option("-n, --n <tokens>", "tokens to generate", intArg(tokensMin, 1 << 20), 32)
    .option("--seed <n>", "sampling seed", intArg(0, 0xffffffff), 1)
    .option("--temperature <t>", "sampling temperature (0 = greedy)", numberArg(0, 100), 0)
    .option("--top-k <k>", "keep the k most likely tokens (0 = all)", intArg(0, 1 << 20), 40)
    .option("--top-p <p>", "nucleus sampling threshold", numberArg(0, 1), 0.95);
}
