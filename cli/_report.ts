/** Shared pieces of `--json` reports. */
import type { LlamaLibrary } from "../ffi/mod.ts";
import { type Engine, type RuntimeConfig, UBATCH_TOKENS } from "../serve/engine.ts";

/** The numerics a runtime config runs with: what must match for bit-exact continuation. */
export function numericsOf(c: RuntimeConfig, lib: LlamaLibrary) {
  return {
    model: c.modelPath,
    nCtx: c.nCtx,
    chunkTokens: c.chunkTokens,
    nUbatch: UBATCH_TOKENS,
    threads: c.threads,
    flashAttention: c.flashAttention,
    typeK: c.typeK,
    typeV: c.typeV,
    swaFull: c.swaFull ?? false,
    cpuVariant: lib.cpuVariant,
    llamaCpp: lib.release,
    llamaBuildId: lib.buildId,
  };
}

/** The numerics of an open engine. */
export function numericsReport(engine: Engine) {
  const o = engine.model.offload;
  return {
    ...numericsOf(engine.config, engine.lib),
    nCtx: engine.ctx.nCtx,
    gpuLayers: o.gpuLayers,
    computeBackend: o.backend,
    computeDevice: o.device,
    ...(o.fallback ? { gpuFallback: o.fallback } : {}),
  };
}
