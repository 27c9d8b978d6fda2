/** Shared pieces of `--json` reports. */
import type { Engine } from "../serve/engine.ts";

/** The numerics an engine runs with: what must match for bit-exact continuation. */
export function numericsReport(engine: Engine) {
  const c = engine.config;
  return {
    model: c.modelPath,
    nCtx: engine.ctx.nCtx,
    chunkTokens: c.chunkTokens,
    threads: c.threads,
    flashAttention: c.flashAttention,
    typeK: c.typeK,
    typeV: c.typeV,
    cpuVariant: engine.lib.cpuVariant,
    llamaCpp: engine.lib.release,
    llamaBuildId: engine.lib.buildId,
  };
}
