/**
 * `model make`: writes a random-weight test model (a family at a preset, from a seed) as GGUF.
 * `model info`: prints what a GGUF file is and the state sizes its metadata implies.
 */
import { type Command, Option } from "commander";
import {
  FAMILIES,
  KV_TYPES,
  type KvType,
  layerPattern,
  makeModel,
  PRESETS,
  SEED_MAX,
  writeChunksToFile,
  type WriteProgress,
} from "../models/mod.ts";
import { intArg } from "./_options.ts";
import { formatBytes, formatModelInfo, modelInfo, type RuntimeStateProbe } from "./_model_info.ts";

interface MakeFlags {
  family: string;
  preset: string;
  seed: number;
  out: string;
}

interface InfoFlags {
  json: boolean;
  kvType: KvType;
  measure: boolean;
}

/** Files at least this large get a progress line on a terminal. */
const PROGRESS_BYTES_MIN = 16 << 20;

/**
 * Registers `model make` and `model info`. `probe`, when given, lets `model info --measure`
 * load the model and add the state sizes the runtime reports.
 */
export function register(program: Command, probe?: RuntimeStateProbe): void {
  const model = program.command("model").description("make and inspect GGUF models");
  model
    .command("make")
    .description("write a random-weight test model as GGUF (same seed, same bytes)")
    .requiredOption("--family <family>", `model family: ${FAMILIES.join(", ")}`)
    .option("--preset <preset>", `size preset: ${PRESETS.join(", ")}`, "tiny")
    .option("--seed <n>", "weight seed", intArg(0, SEED_MAX), 0)
    .requiredOption("--out <file>", "where to write the .gguf file")
    .action((flags: MakeFlags) => runMake(flags));
  const info = model
    .command("info")
    .description("show a GGUF model's architecture, layers, dimensions and state sizes")
    .argument("<file>", "GGUF model file")
    .option("--json", "print one JSON object", false)
    .addOption(
      new Option("--kv-type <type>", "K/V cache type for the state sizes")
        .choices(Object.keys(KV_TYPES))
        .default("f16"),
    );
  if (probe) {
    info.option("--no-measure", "skip loading the model to measure state sizes at runtime");
  }
  info.action((file: string, flags: InfoFlags) => runInfo(file, flags, probe));
}

async function runMake(flags: MakeFlags): Promise<void> {
  const made = makeModel({ family: flags.family, preset: flags.preset, seed: flags.seed });
  const total = made.layout.totalBytes;
  const progress = Deno.stderr.isTerminal() && total >= PROGRESS_BYTES_MIN
    ? progressLine(flags.out)
    : undefined;
  const written = await writeChunksToFile(flags.out, made.chunks, {
    totalBytes: total,
    onProgress: progress?.update,
  });
  progress?.done();
  const params = (made.paramCount / 1e6).toFixed(2);
  console.log(
    `Wrote ${flags.family} ${flags.preset} (seed ${flags.seed}) to ${flags.out}: ` +
      `${formatBytes(written)}, ${params} M parameters, layers ${layerPattern(made.spec)}`,
  );
}

/** A single self-overwriting stderr line, redrawn at most once per percent. */
function progressLine(path: string) {
  const encoder = new TextEncoder();
  let shown = -1;
  const write = (s: string) => Deno.stderr.writeSync(encoder.encode(s));
  return {
    update: ({ writtenBytes, totalBytes }: WriteProgress) => {
      const percent = Math.floor((100 * writtenBytes) / (totalBytes ?? writtenBytes));
      if (percent === shown) return;
      shown = percent;
      write(`\rwriting ${path}: ${percent}% of ${formatBytes(totalBytes ?? 0)}`);
    },
    done: () => write("\r\x1b[2K"),
  };
}

async function runInfo(file: string, flags: InfoFlags, probe?: RuntimeStateProbe) {
  const report = await modelInfo(file, flags.kvType, flags.measure ? probe : undefined);
  if (flags.json) console.log(JSON.stringify(report, null, 2));
  else console.log(formatModelInfo(report).join("\n"));
}
