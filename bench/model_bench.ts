/**
 * Local runtime speed per model family: prefill and decode tokens/s (median of repeats) and
 * the FFI overhead per decode call (wall time per call minus llama.cpp's own eval time).
 */
import { syntheticTokens } from "../models/mod.ts";
import { ensureModelFile, FAMILIES } from "../models/mod.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { median, repeat } from "./stats.ts";

export interface ModelBenchRow {
  family: string;
  preset: string;
  promptTokens: number;
  prefillTokensPerSec: number;
  decodeTokensPerSec: number;
  /** Wall time per decode call minus llama.cpp's measured eval time, microseconds. */
  ffiOverheadUs: number;
}

export interface ModelBenchOptions {
  modelDir: string;
  families?: readonly string[];
  preset?: string;
  promptTokens?: number;
  decodeTokens?: number;
  repeats?: number;
}

export async function runModelBench(o: ModelBenchOptions): Promise<ModelBenchRow[]> {
  const rows: ModelBenchRow[] = [];
  const preset = o.preset ?? "tiny";
  const promptTokens = o.promptTokens ?? 2048;
  const decodeTokens = o.decodeTokens ?? 128;
  for (const family of o.families ?? FAMILIES) {
    const path = await ensureModelFile(o.modelDir, { family, preset, seed: 1 });
    using engine = await Engine.open({
      ...RUNTIME_DEFAULTS,
      modelPath: path,
      nCtx: promptTokens + decodeTokens + 256,
      chunkTokens: 512,
    });
    const tokens = syntheticTokens(promptTokens, engine.model.vocab.nTokens);
    const runs = await repeat(o.repeats ?? 3, async () => {
      engine.ctx.clearMemory();
      engine.adoptPosition(0);
      const t0 = performance.now();
      await engine.prefill(tokens);
      const prefillMs = performance.now() - t0;
      engine.ctx.resetPerf();
      const t1 = performance.now();
      for (let i = 0; i < decodeTokens; i++) await engine.step(tokens[i]);
      const decodeMs = performance.now() - t1;
      const perf = engine.ctx.perf();
      return { prefillMs, decodeMs, evalMs: perf.evalMs, evalTokens: perf.evalTokens };
    }, 1);
    rows.push({
      family,
      preset,
      promptTokens,
      prefillTokensPerSec: promptTokens / (median(runs.map((r) => r.prefillMs)) / 1000),
      decodeTokensPerSec: decodeTokens / (median(runs.map((r) => r.decodeMs)) / 1000),
      ffiOverheadUs: median(runs.map((r) => (r.decodeMs - r.evalMs) / decodeTokens * 1000)),
    });
  }
  return rows;
}
