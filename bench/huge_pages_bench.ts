/**
 * Huge pages side by side: each repeat starts one fresh process per way a worker can be paged
 * (ffi/huge_pages.ts), in a rotating order, and times a prefill, the first 1-token decode after
 * it (each side's continuation probe is such a decode) and the three after that, on lab-state,
 * one llama.cpp thread:
 *
 * - `off`: `--huge-pages off` (4 KiB pages, the weights mapped from the file);
 * - `advised`: huge pages asked for without glibc's tunable (the weights read into memory, they
 *   and the context advised and collapsed after allocation);
 * - `tunable`: started with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, as this project starts its
 *   workers; glibc 2.36 takes it in some processes only, so each repeat says what it drew
 *   (`malloc`, or `advised` where glibc did not take it).
 *
 *   deno run -A bench/huge_pages_bench.ts [--repeats 3] [--tokens 512] [--model <gguf>] [--out DIR]
 *
 * Not a test: numbers move between runs; medians over the repeats, every repeat printed. Prints
 * counts and milliseconds only. With `--out`, writes `huge-pages.json` and `huge-pages.svg`.
 */
import { memoryPaging } from "../ffi/mod.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { barChart } from "./svg.ts";
import { median } from "./stats.ts";
import { benchArgs, modelOrLabState, orExit, wholeNumber } from "./cli_args.ts";

const MODES = ["off", "advised", "tunable"] as const;
type Mode = typeof MODES[number];

/** What one process measured. */
interface Sample {
  mode: Mode;
  /** How the process was paged: `malloc`, `advised` or `none`. */
  paging: string;
  anonHugeMiB: number;
  prefillMs: number;
  firstDecodeMs: number;
  /** The median of the three decodes after the first. */
  stepMs: number;
}

const values = benchArgs("huge_pages_bench.ts", {
  repeats: { default: "3" },
  tokens: { default: "512" },
  model: { default: "", what: "GGUF (default: lab-state, made once)" },
  out: { default: "", what: "DIR" },
  child: { default: "", what: "MODE (internal: the process one repeat starts)" },
});
const repeats = orExit(() => wholeNumber("--repeats", values.repeats, 1, 20));
const tokens = orExit(() => wholeNumber("--tokens", values.tokens, 1, 8192));
const modelPath = await modelOrLabState(values.model || undefined);

if (values.child) {
  console.log(JSON.stringify(await measure(values.child as Mode)));
} else {
  await main();
}

/** In this process: prefill, the first decode, three more; how the process is paged. */
async function measure(mode: Mode): Promise<Sample> {
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath,
    nCtx: Math.ceil((tokens + 16) / 256) * 256,
    chunkTokens: Math.min(512, tokens),
    threads: 1,
    hugePages: mode !== "off",
  });
  const prompt = new Int32Array(tokens).map((_, i) => 100 + (i * 7) % 200);
  const t0 = performance.now();
  await engine.prefill(prompt);
  const prefillMs = performance.now() - t0;
  const steps: number[] = [];
  for (let i = 0; i < 4; i++) {
    const t = performance.now();
    await engine.step(42 + i);
    steps.push(performance.now() - t);
  }
  const rollup = Deno.readTextFileSync("/proc/self/smaps_rollup");
  const anonHugeKiB = Number(rollup.match(/^AnonHugePages:\s+(\d+)/m)?.[1] ?? 0);
  const paging = memoryPaging(mode !== "off", engine.model.weightsInHugePages);
  return {
    mode,
    paging,
    anonHugeMiB: Math.round(anonHugeKiB / 1024),
    prefillMs,
    firstDecodeMs: steps[0],
    stepMs: median(steps.slice(1)),
  };
}

/** One fresh process for `mode`. */
async function child(mode: Mode): Promise<Sample> {
  const env: Record<string, string> = { GLIBC_TUNABLES: "" };
  if (mode === "tunable") env.GLIBC_TUNABLES = "glibc.malloc.hugetlb=1";
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL(import.meta.url).pathname,
      ...["--child", mode, "--tokens", String(tokens), "--model", modelPath],
    ],
    env,
    stderr: "null",
  }).output();
  if (out.code !== 0) throw new Error(`the ${mode} process exited with ${out.code}`);
  return JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
}

async function main(): Promise<void> {
  if (Deno.build.os !== "linux") {
    console.error("huge pages are Linux's: nothing to compare here");
    Deno.exit(2);
  }
  const samples: Sample[] = [];
  for (let r = 0; r < repeats; r++) {
    // A rotating order: no way of paging always runs first, or last.
    for (let k = 0; k < MODES.length; k++) {
      const s = await child(MODES[(k + r) % MODES.length]);
      samples.push(s);
      console.error(
        `repeat ${r + 1}/${repeats} ${s.mode} (${s.paging}): prefill ${
          s.prefillMs.toFixed(0)
        } ms, ` +
          `first decode ${s.firstDecodeMs.toFixed(1)} ms, then ${s.stepMs.toFixed(1)} ms`,
      );
    }
  }
  const of = (m: Mode) => samples.filter((s) => s.mode === m);
  const off = of("off");
  const med = (xs: Sample[], k: "prefillMs" | "firstDecodeMs" | "stepMs") =>
    median(xs.map((s) => s[k]));
  console.log(
    `lab-state-like model, ${tokens}-token prefill, one thread, ${repeats} processes per row:`,
  );
  console.log(
    "mode     paging drawn          AnonHuge MiB  prefill ms (x off)  first decode ms (x off)  then ms",
  );
  for (const m of MODES) {
    const xs = of(m);
    const drawn = [...new Set(xs.map((s) => s.paging))]
      .map((p) => `${p} ${xs.filter((s) => s.paging === p).length}`).join(", ");
    const ratio = (k: "prefillMs" | "firstDecodeMs") => (med(xs, k) / med(off, k)).toFixed(2);
    console.log(
      `${m.padEnd(8)} ${drawn.padEnd(21)} ${
        String(median(xs.map((s) => s.anonHugeMiB))).padStart(12)
      }` +
        `  ${med(xs, "prefillMs").toFixed(0).padStart(10)} (${ratio("prefillMs")})` +
        `  ${med(xs, "firstDecodeMs").toFixed(1).padStart(15)} (${ratio("firstDecodeMs")})` +
        `  ${med(xs, "stepMs").toFixed(1).padStart(7)}`,
    );
  }
  if (values.out) {
    await Deno.mkdir(values.out, { recursive: true });
    await Deno.writeTextFile(`${values.out}/huge-pages.json`, JSON.stringify({ tokens, samples }));
    // Each against `off`: a prefill of seconds and decodes of milliseconds on one readable axis.
    const keys = ["prefillMs", "firstDecodeMs", "stepMs"] as const;
    const svg = barChart(
      ["prefill", "first decode", "the decodes after"],
      MODES.map((m) => ({
        name: m,
        values: keys.map((k) => med(of(m), k) / med(off, k)),
      })),
      {
        title: `Huge pages: lab-state, ${tokens}-token prefill, one thread (medians of ${repeats})`,
        xLabel: "",
        yLabel: "time against off (1 = the same)",
      },
    );
    await Deno.writeTextFile(`${values.out}/huge-pages.svg`, svg);
  }
}
