/**
 * Layer capture (../ffi/layer_capture.ts) against the full PARTIAL_ONLY export, on the last
 * prompt chunk of a hybrid model. Side by side in one run, medians of repeats, modes
 * interleaved per repeat:
 *
 * Modes run in an order rotated per repeat.
 *
 * - `no callback`: the context without the shim's eval callback (llama.cpp's default);
 * - `disarmed`: a capture open but not armed (the callback is only on the context while armed,
 *   so this should equal `no callback`);
 * - `armed, no copy`: each layer's two final-state writes observed (graph split there),
 *   readiness times only;
 * - `armed + copy`: observed, rows copied in the callback, and drained by JavaScript as they
 *   become ready (a copy per layer, as a sender would take).
 *
 * Per mode: the last chunk's decode time; when layers become ready relative to the decode's end
 * (negative = before it); how long after the end the last layer is in JavaScript's hands; and
 * the time of a full PARTIAL_ONLY export after the decode (what the capture replaces). Wall
 * times on a shared machine are noisy; the CPU column (all threads of the process, Linux) shows
 * the work itself.
 *
 * `deno run -A --unstable-net bench/layer_capture_bench.ts --model <gguf> [--prompt 1024]
 * [--chunk 512] [--repeats 3] [--threads 2]`
 */
import {
  type ContextOptions,
  LlamaBatch,
  LlamaContext,
  LlamaModel,
  loadLlama,
} from "../ffi/mod.ts";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "../ffi/llama.ts";
import { LayerCapture } from "../ffi/layer_capture.ts";
import { testTokens } from "../testing/models.ts";
import { median, table } from "./stats.ts";
import { benchArgs, benchUsage, orExit, wholeNumber } from "./cli_args.ts";

const MODES = ["no callback", "disarmed", "armed, no copy", "armed + copy"] as const;
type Mode = typeof MODES[number];

interface Run {
  decodeMs: number;
  /** CPU time all threads of this process spent during the decode (Linux; NaN elsewhere). */
  decodeCpuMs: number;
  /** Per recurrent layer: ready time minus decode end, ms (armed modes). */
  readyVsEndMs: number[];
  /** Last layer drained by JavaScript, minus decode end, ms (copy mode). */
  drainedVsEndMs: number;
  exportMs: number;
  exact: boolean | null;
  observed: number;
  /** Callback time copying rows (native clock). */
  copyMs: number;
}

export interface LayerCaptureBenchOptions {
  model: string;
  promptTokens: number;
  chunkTokens: number;
  repeats: number;
  threads: number;
}

const ms = (ns: bigint) => Number(ns) / 1e6;

/** One bench's context, prompt and capture, shared by every run. */
interface _Bench {
  ctx: LlamaContext;
  batch: LlamaBatch;
  tokens: Int32Array;
  /** First position of the last chunk. */
  last: number;
  chunkTokens: number;
  /** Open while a mode needs the shim's callback (`_setCallback`). */
  capture: LayerCapture | null;
}

export async function runLayerCaptureBench(o: LayerCaptureBenchOptions): Promise<string> {
  const lib = loadLlama();
  using model = await LlamaModel.load(lib, o.model, {});
  const options: ContextOptions = {
    nCtx: Math.max(4096, o.promptTokens + 256),
    nBatch: o.chunkTokens,
    nUbatch: o.chunkTokens,
    threads: o.threads,
    flashAttention: false,
    typeK: "f16",
    typeV: "f16",
  };
  using ctx = await LlamaContext.create(model, options);
  const tokens = testTokens(o.promptTokens, Math.min(model.vocab.nTokens, 950));
  const b: _Bench = {
    ctx,
    batch: new LlamaBatch(o.chunkTokens),
    tokens,
    last: Math.floor((tokens.length - 1) / o.chunkTokens) * o.chunkTokens,
    chunkTokens: o.chunkTokens,
    capture: null,
  };
  const runs = new Map<Mode, Run[]>(MODES.map((m) => [m, []]));
  await _runOnce(b, "no callback"); // warm-up
  for (let r = 0; r < o.repeats; r++) {
    // Rotated per repeat, so no mode always runs right after the same neighbour.
    for (let i = 0; i < MODES.length; i++) {
      const mode = MODES[(i + r) % MODES.length];
      runs.get(mode)!.push(await _runOnce(b, mode));
    }
  }
  await _setCallback(b, true);
  const info = b.capture!;
  const lines = [
    `model ${o.model}: ${info.nLayers} recurrent of ${info.nTrunkLayers} layers, conv row ` +
    `${info.convRowBytes} B, SSM row ${info.ssmRowBytes} B, snapshot ` +
    `${ctx.stateSeqSize(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)} B`,
    `prompt ${o.promptTokens} tokens, last chunk ${tokens.length - b.last} tokens (ubatch ` +
    `${o.chunkTokens}), ${o.threads} threads, medians of ${o.repeats}`,
    "",
  ];
  lines.push(_modeTable(runs));
  lines.push(..._perLayerLines(runs.get("armed + copy")!, info.nLayers));
  info.close();
  return lines.join("\n");
}

/** Opens the capture (the shim's eval callback on the context) or closes it. */
async function _setCallback(b: _Bench, on: boolean): Promise<void> {
  if (!on) {
    b.capture?.close();
    b.capture = null;
  } else if (!b.capture) {
    const opened = await LayerCapture.open(b.ctx);
    if (!opened.ok) throw new Error(`layer capture unavailable: ${opened.reason}`);
    b.capture = opened.capture;
  }
}

/** The prompt from an empty memory in `mode`: every chunk but the last untimed, the last timed. */
async function _runOnce(b: _Bench, mode: Mode): Promise<Run> {
  await _setCallback(b, mode !== "no callback");
  const { ctx, batch, tokens, last } = b;
  ctx.clearMemory();
  for (let p0 = 0; p0 < last; p0 += b.chunkTokens) {
    batch.fill(tokens.subarray(p0, p0 + b.chunkTokens), p0);
    await ctx.decode(batch);
  }
  batch.fill(tokens.subarray(last), last);
  const c = b.capture as LayerCapture | null;
  const armed = mode === "armed, no copy" || mode === "armed + copy";
  if (c && armed) await c.arm(0, tokens.length - 1, { copyRows: mode === "armed + copy" });
  const clock = () => c?.nowNs() ?? BigInt(Math.round(performance.now() * 1e6));
  const cpu0 = cpuNs();
  const t0 = clock();
  const done = ctx.decode(batch);
  let drained = 0n;
  const drainedAll = mode === "armed + copy" && c
    ? (async () => {
      for await (const _ of c.layers(done)) drained = c.nowNs();
    })()
    : Promise.resolve();
  await done;
  const end = clock();
  await drainedAll;
  const cpu1 = cpuNs();
  const readyVsEndMs = c && armed
    ? Array.from({ length: c.nLayers }, (_, k) => ms(c.readyNs(k) - end))
    : [];
  const observed = c?.stats().observed ?? 0;
  const copyMs = c?.stats().copyMs ?? 0;
  if (c && armed) await c.disarm();
  const e0 = performance.now();
  const blob = await ctx.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  const exportMs = performance.now() - e0;
  const exact = mode === "armed + copy" && c ? equal(c.snapshot(), blob) : null;
  return {
    decodeMs: ms(end - t0),
    decodeCpuMs: cpu0 === null || cpu1 === null ? NaN : ms(cpu1 - cpu0),
    readyVsEndMs,
    drainedVsEndMs: mode === "armed + copy" ? ms(drained - end) : NaN,
    exportMs,
    exact,
    observed,
    copyMs,
  };
}

/** One line per mode: medians (and minima) of its repeats. */
function _modeTable(runs: Map<Mode, Run[]>): string {
  const rows = MODES.map((mode) => {
    const rs = runs.get(mode)!;
    const col = (f: (r: Run) => number) => median(rs.map(f));
    const armed = rs[0].readyVsEndMs.length > 0;
    return [
      mode,
      col((r) => r.decodeMs),
      Math.min(...rs.map((r) => r.decodeMs)),
      col((r) => r.decodeCpuMs),
      Math.min(...rs.map((r) => r.decodeCpuMs)),
      armed ? col((r) => r.readyVsEndMs[0]) : "-",
      armed ? col((r) => median(r.readyVsEndMs)) : "-",
      armed ? col((r) => r.readyVsEndMs.at(-1)!) : "-",
      mode === "armed + copy" ? col((r) => r.drainedVsEndMs) : "-",
      col((r) => r.exportMs),
      rs[0].observed,
      mode === "armed + copy" ? col((r) => r.copyMs) : "-",
      rs[0].exact === null ? "-" : rs.every((r) => r.exact) ? "yes" : "NO",
    ];
  });
  return table([
    "mode",
    "last chunk ms",
    "min",
    "CPU ms",
    "min",
    "layer 1 ready vs end ms",
    "median layer",
    "last layer",
    "last drained vs end ms",
    "PARTIAL_ONLY export ms",
    "observed nodes",
    "callback copy ms",
    "capture exact",
  ], rows);
}

/** `armed + copy`'s per-layer ready times (median over repeats), ten layers a line. */
function _perLayerLines(copy: Run[], nLayers: number): string[] {
  const perLayer = Array.from(
    { length: nLayers },
    (_, k) => median(copy.map((r) => r.readyVsEndMs[k])),
  );
  const lines = ["", "armed + copy, per recurrent layer, ready vs decode end (ms, median):"];
  for (let k = 0; k < perLayer.length; k += 10) {
    lines.push(
      perLayer.slice(k, k + 10).map((v, i) => `${k + i}:${v.toFixed(1)}`).join("  "),
    );
  }
  return lines;
}

/**
 * CPU time of this process so far, exited threads included (`/proc/self/stat` utime + stime,
 * in clock ticks of 10 ms), or null where that is not readable. Wall time on a shared machine
 * mostly measures the neighbours; CPU time shows the work itself.
 */
function cpuNs(): bigint | null {
  try {
    const stat = Deno.readTextFileSync("/proc/self/stat");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (BigInt(f[11]) + BigInt(f[12])) * 10_000_000n; // fields 14 and 15, CLK_TCK = 100
  } catch {
    return null;
  }
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  if (a.byteLength !== b.byteLength) return false;
  const words = a.byteLength >> 2;
  const wa = new Uint32Array(a.buffer, a.byteOffset, words);
  const wb = new Uint32Array(b.buffer, b.byteOffset, words);
  for (let i = 0; i < words; i++) if (wa[i] !== wb[i]) return false;
  for (let i = words << 2; i < a.byteLength; i++) if (a[i] !== b[i]) return false;
  return true;
}

if (import.meta.main) {
  const flags = {
    model: { default: "", what: "GGUF (required)" },
    prompt: { default: "1024", what: "tokens" },
    chunk: { default: "512", what: "tokens" },
    repeats: { default: "3" },
    threads: { default: "2" },
  };
  const values = benchArgs("layer_capture_bench.ts", flags);
  if (!values.model) {
    console.error(
      `error: --model is required\nusage: ${benchUsage("layer_capture_bench.ts", flags)}`,
    );
    Deno.exit(2);
  }
  console.log(
    await runLayerCaptureBench({
      model: values.model,
      promptTokens: orExit(() => wholeNumber("--prompt", values.prompt, 1, 1 << 20)),
      chunkTokens: orExit(() => wholeNumber("--chunk", values.chunk, 1, 1 << 16)),
      repeats: orExit(() => wholeNumber("--repeats", values.repeats, 1, 100)),
      threads: orExit(() => wholeNumber("--threads", values.threads, 1, 256)),
    }),
  );
}
