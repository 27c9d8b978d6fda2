/**
 * Measures a model's state sizes as the runtime reports them: prefill synthetic tokens to two
 * lengths and read llama.cpp's sequence-state size at each. The growth per token is the
 * attention KV (with per-cell metadata); the rest is fixed (recurrent snapshot, framing).
 */
import { syntheticTokens } from "../models/mod.ts";
import type { RuntimeStateBytes, RuntimeStateProbe } from "./_model_info.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import {
  type KvType,
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY,
  recurrentPayloadBytes,
} from "../ffi/mod.ts";

/** Tokens between the two measurements: the state grows by exactly this many cells. */
const STEP_TOKENS = 32;
/** Per-cell metadata of a one-sequence state blob: pos (i32), n_seq_id (u32), seq_id (i32). */
export const CELL_META_BYTES = 12;

export const measureStateBytes: RuntimeStateProbe = async (path, spec, kvType: KvType) => {
  // Past the sliding window the SWA part stops growing, so measure beyond twice the window.
  const window = spec.attention?.slidingWindow ?? 0;
  const n1 = Math.max(64, 2 * window);
  const n2 = n1 + STEP_TOKENS;
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: path,
    nCtx: Math.ceil((n2 + 1) / 256) * 256,
    chunkTokens: 256,
    typeK: kvType,
    typeV: kvType,
  });
  const tokens = syntheticTokens(n2, engine.model.vocab.nTokens);
  await engine.prefill(tokens.subarray(0, n1));
  const s1 = engine.ctx.stateSeqSize(0);
  await engine.prefill(tokens.subarray(n1));
  const s2 = engine.ctx.stateSeqSize(0);
  const bytesPerToken = (s2 - s1) / STEP_TOKENS;
  // Only for models whose whole KV grows per token (no sliding window).
  const kvBytesPerToken = window === 0 && bytesPerToken > 0
    ? bytesPerToken - CELL_META_BYTES
    : undefined;
  const recurrentBytes = spec.ssm
    ? recurrentPayloadBytes(await engine.ctx.stateSeqGet(0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY))
    : null;
  const result: RuntimeStateBytes = {
    bytesPerToken,
    fixedBytes: s1 - n1 * bytesPerToken,
    ...(kvBytesPerToken !== undefined ? { kvBytesPerToken } : {}),
    ...(recurrentBytes !== null ? { recurrentBytes } : {}),
    method: `llama_state_seq_get_size after ${n1} and ${n2} prompt tokens` +
      (recurrentBytes !== null ? "; conv+SSM rows of the recurrent snapshot" : ""),
  };
  return result;
};
