/**
 * The continuation-state sizes a model implies, computed from its dimensions with llama.cpp's
 * own formulas, so runtime exports can be checked against them:
 *
 * - attention KV per token and layer: `ggml_row_size(type_k, head_dim * n_head_kv)` +
 *   `ggml_row_size(type_v, head_dim * n_head_kv)` (`llama_kv_cache`, one cell per token);
 * - conv state per recurrent layer: (d_conv - 1) x (d_inner + 2 n_group d_state) f32
 *   (`llama_hparams::n_embd_r`);
 * - SSM state per recurrent layer: d_state x d_inner f32 (`llama_hparams::n_embd_s`);
 *   `llama_memory_recurrent` always stores both as f32, whatever the KV type.
 *
 * Only Nemotron-H attention layers enter the hybrid cache (the nextn block is skipped there);
 * the MTP draft context keeps a plain KV cache over the nextn layers only. Sizes are per
 * sequence and exclude the small framing of a state blob (magic, cell metadata).
 */
import { ggmlTensorBytes } from "./_gguf_types.ts";
import { hasAttention, type ModelSpec } from "./spec.ts";

import { KV_CACHE_TYPES, type KvType } from "../core/kv_types.ts";

/** K/V cache element types, by ggml type code (the one table in core/kv_types.ts). */
export const KV_TYPES = KV_CACHE_TYPES;
export type { KvType };

export interface StateBytes {
  /** Global-attention KV bytes per prompt token (grows with the prompt). */
  readonly kvBytesPerToken: number;
  /** Sliding-window KV bytes per cached token (the SWA cache is bounded by the window). */
  readonly swaKvBytesPerToken: number;
  /** Tokens a sliding-window layer attends to; 0 when the model has none. */
  readonly slidingWindow: number;
  /** Conv state of all recurrent layers, per sequence (fixed). */
  readonly convBytes: number;
  /** SSM state of all recurrent layers, per sequence (fixed). */
  readonly ssmBytes: number;
  /** `convBytes + ssmBytes`. */
  readonly recurrentBytes: number;
  /** KV bytes per token of the MTP draft context (nextn layers). */
  readonly mtpKvBytesPerToken: number;
  readonly layers: {
    readonly attention: number;
    readonly slidingWindow: number;
    readonly recurrent: number;
    readonly mtp: number;
  };
  /** `recurrentBytes / kvBytesPerToken`: prompt tokens whose KV weighs as much as the state. */
  readonly recurrentTokenEquivalent: number;
}

/** Bytes of one K row plus one V row of a layer with `nHeadKv` KV heads. */
export function kvRowBytes(
  headDim: number,
  nHeadKv: number,
  kvType: KvType | { k: KvType; v: KvType } = "f16",
): number {
  const { k, v } = typeof kvType === "string" ? { k: kvType, v: kvType } : kvType;
  const width = headDim * nHeadKv;
  const kBytes = ggmlTensorBytes(KV_TYPES[k], width, width);
  const vBytes = ggmlTensorBytes(KV_TYPES[v], width, width);
  if (kBytes === undefined || vBytes === undefined) {
    throw new RangeError(`KV width ${width} is not a whole number of ${k}/${v} blocks`);
  }
  return kBytes + vBytes;
}

/**
 * Expected state sizes of `spec` with K/V cache type `kvType` (default f16).
 *
 * @example
 * ```ts
 * const s = expectedStateBytes(familySpec("hybrid", "super-mini"), "f16");
 * s.kvBytesPerToken; // 512
 * s.recurrentBytes;  // 10_670_080
 * ```
 */
export function expectedStateBytes(
  spec: ModelSpec,
  kvType: KvType | { k: KvType; v: KvType } = "f16",
): StateBytes {
  const a = spec.attention;
  const perLayerKv = a ? kvRowBytes(a.headDim, a.nHeadKv, kvType) : 0;
  const globalLayers = spec.layers.filter((k) => hasAttention(k) && k !== "swa-transformer");
  const swaLayers = spec.layers.filter((k) => k === "swa-transformer");
  const recurrentLayers = spec.layers.filter((k) => k === "mamba").length;
  const s = spec.ssm;
  const convPerLayer = s ? (s.dConv - 1) * (s.dInner + 2 * s.nGroup * s.dState) * 4 : 0;
  const ssmPerLayer = s ? s.dState * s.dInner * 4 : 0;
  const kvBytesPerToken = globalLayers.length * perLayerKv;
  const convBytes = recurrentLayers * convPerLayer;
  const ssmBytes = recurrentLayers * ssmPerLayer;
  return {
    kvBytesPerToken,
    swaKvBytesPerToken: swaLayers.length * perLayerKv,
    slidingWindow: swaLayers.length > 0 ? a?.slidingWindow ?? 0 : 0,
    convBytes,
    ssmBytes,
    recurrentBytes: convBytes + ssmBytes,
    mtpKvBytesPerToken: spec.nextnLayers * perLayerKv,
    layers: {
      attention: globalLayers.length,
      slidingWindow: swaLayers.length,
      recurrent: recurrentLayers,
      mtp: spec.nextnLayers,
    },
    recurrentTokenEquivalent: kvBytesPerToken > 0 ? (convBytes + ssmBytes) / kvBytesPerToken : 0,
  };
}
