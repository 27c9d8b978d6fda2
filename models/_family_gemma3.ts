/**
 * `iswa`: llama.cpp's `gemma3` architecture, interleaved sliding-window attention. With
 * `attention.sliding_window` set, every `swaPeriod`-th layer (the last of each period) is
 * global and the rest see only the window, and llama.cpp gives the model a
 * `llama_kv_cache_iswa`: a global cache that grows with the prompt and a bounded SWA cache.
 *
 * Why gemma3: it is the most widely deployed ISWA family (5 local : 1 global), loads on CPU,
 * needs only standard tensors plus Q/K norms and post-norms, has no attention soft-capping
 * (gemma2) and no parallel-block or logit-scale quirks (cohere2), and is not MoE (llama4).
 */
import { assert } from "../core/errors.ts";
import { type GgufMetadata, gv } from "./gguf_writer.ts";
import type { ModelSpec } from "./spec.ts";
import { TensorList } from "./_tensors.ts";
import { attentionProjections, embeddingAndHead } from "./_family_llama.ts";

const NORM_EPS = 1e-6;

/** Architecture-specific metadata and tensors of a `gemma3` model. */
export function buildGemma3(spec: ModelSpec): { metadata: GgufMetadata; tensors: TensorList } {
  const a = spec.attention;
  assert(a?.slidingWindow !== undefined && a.swaPeriod !== undefined, "iswa needs a window");
  assert(spec.nFf !== undefined, "iswa spec needs nFf");
  const p = "gemma3";
  const metadata: GgufMetadata = [
    [`${p}.context_length`, gv.u32(spec.contextLength)],
    [`${p}.embedding_length`, gv.u32(spec.nEmbd)],
    [`${p}.block_count`, gv.u32(spec.layers.length)],
    [`${p}.feed_forward_length`, gv.u32(spec.nFf)],
    [`${p}.attention.head_count`, gv.u32(a.nHead)],
    [`${p}.attention.head_count_kv`, gv.u32(a.nHeadKv)],
    [`${p}.attention.key_length`, gv.u32(a.headDim)],
    [`${p}.attention.value_length`, gv.u32(a.headDim)],
    [`${p}.attention.layer_norm_rms_epsilon`, gv.f32(NORM_EPS)],
    [`${p}.attention.sliding_window`, gv.u32(a.slidingWindow)],
    [`${p}.attention.sliding_window_pattern`, gv.u32(a.swaPeriod)],
    [`${p}.rope.freq_base`, gv.f32(1000000)],
    [`${p}.rope.freq_base_swa`, gv.f32(10000)],
  ];
  const t = new TensorList(spec.weightType);
  embeddingAndHead(t, spec);
  spec.layers.forEach((_, i) => {
    t.norm(`blk.${i}.attn_norm.weight`, spec.nEmbd);
    attentionProjections(t, i, spec);
    t.norm(`blk.${i}.attn_q_norm.weight`, a.headDim);
    t.norm(`blk.${i}.attn_k_norm.weight`, a.headDim);
    t.norm(`blk.${i}.post_attention_norm.weight`, spec.nEmbd);
    t.norm(`blk.${i}.ffn_norm.weight`, spec.nEmbd);
    t.matrix(`blk.${i}.ffn_gate.weight`, [spec.nEmbd, spec.nFf!]);
    t.matrix(`blk.${i}.ffn_up.weight`, [spec.nEmbd, spec.nFf!]);
    t.matrix(`blk.${i}.ffn_down.weight`, [spec.nFf!, spec.nEmbd]);
    t.norm(`blk.${i}.post_ffw_norm.weight`, spec.nEmbd);
  });
  return { metadata, tensors: t };
}
