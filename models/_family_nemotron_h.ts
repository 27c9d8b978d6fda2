/**
 * `hybrid` and `hybrid-moe-mtp`: llama.cpp's `nemotron_h` and `nemotron_h_moe`. Each layer is
 * one of Mamba2, attention (no RoPE), or MLP/MoE, decided per layer i from two arrays:
 * Mamba2 when head_count_kv[i] == 0 and feed_forward_length[i] == 0, attention when only
 * head_count_kv[i] > 0, MLP (MoE in nemotron_h_moe) otherwise. An MTP (nextn) block, if any,
 * is the last block: `block_count` includes it, and it needs head_count_kv > 0 and
 * feed_forward_length > 0.
 */
import { assert } from "../core/errors.ts";
import { type GgufMetadata, gv } from "./gguf_writer.ts";
import type { LayerKind, ModelSpec } from "./spec.ts";
import { TensorList } from "./_tensors.ts";
import { attentionProjections, embeddingAndHead } from "./_family_llama.ts";
import { checkSsmDims, mambaMixer, ssmMetadata } from "./_family_mamba2.ts";

const NORM_EPS = 1e-5;

/** Architecture-specific metadata and tensors of a `nemotron_h` / `nemotron_h_moe` model. */
export function buildNemotronH(spec: ModelSpec): { metadata: GgufMetadata; tensors: TensorList } {
  const a = spec.attention;
  assert(a !== undefined && spec.ssm !== undefined, "hybrid spec needs attention and ssm");
  checkSsmDims(spec.ssm);
  const moe = spec.architecture === "nemotron_h_moe";
  assert(!moe || spec.moe !== undefined, "nemotron_h_moe needs moe dims");
  assert(moe || spec.nFf !== undefined, "nemotron_h needs nFf");
  assert(spec.nextnLayers === 0 || moe, "only nemotron_h_moe has an MTP block");
  const p = spec.architecture;
  const ffn = moe ? spec.moe!.nFfExp : spec.nFf!;
  const kinds: (LayerKind | "mtp")[] = [...spec.layers, ...Array(spec.nextnLayers).fill("mtp")];
  const headCountKv = kinds.map((k) => (k === "attention" || k === "mtp" ? a.nHeadKv : 0));
  const ffLength = kinds.map((k) => (k === "mlp" || k === "moe" || k === "mtp" ? ffn : 0));
  const metadata: GgufMetadata = [
    [`${p}.context_length`, gv.u32(spec.contextLength)],
    [`${p}.embedding_length`, gv.u32(spec.nEmbd)],
    [`${p}.block_count`, gv.u32(kinds.length)],
    ...(spec.nextnLayers > 0
      ? [[`${p}.nextn_predict_layers`, gv.u32(spec.nextnLayers)] as const]
      : []),
    [`${p}.feed_forward_length`, gv.i32s(ffLength)],
    [`${p}.attention.head_count`, gv.u32(a.nHead)],
    [`${p}.attention.head_count_kv`, gv.i32s(headCountKv)],
    [`${p}.attention.key_length`, gv.u32(a.headDim)],
    [`${p}.attention.value_length`, gv.u32(a.headDim)],
    [`${p}.attention.layer_norm_rms_epsilon`, gv.f32(NORM_EPS)],
    [`${p}.attention.layer_norm_epsilon`, gv.f32(NORM_EPS)],
    ...ssmMetadata(p, spec.ssm),
    ...(moe ? moeMetadata(p, spec) : []),
  ];
  const t = new TensorList(spec.weightType);
  embeddingAndHead(t, spec);
  kinds.forEach((kind, i) => {
    if (kind === "mtp") return mtpBlock(t, i, spec);
    t.norm(`blk.${i}.attn_norm.weight`, spec.nEmbd);
    if (kind === "mamba") mambaMixer(t, i, spec);
    else if (kind === "attention") attentionProjections(t, i, spec);
    else if (kind === "mlp") {
      t.matrix(`blk.${i}.ffn_up.weight`, [spec.nEmbd, spec.nFf!]);
      t.matrix(`blk.${i}.ffn_down.weight`, [spec.nFf!, spec.nEmbd]);
    } else if (kind === "moe") moeFfn(t, i, spec);
    else assert(false, `nemotron_h has no ${kind} layers`);
  });
  return { metadata, tensors: t };
}

function moeMetadata(p: string, spec: ModelSpec): GgufMetadata {
  const m = spec.moe!;
  return [
    [`${p}.expert_count`, gv.u32(m.nExpert)],
    [`${p}.expert_used_count`, gv.u32(m.nExpertUsed)],
    [`${p}.expert_feed_forward_length`, gv.u32(m.nFfExp)],
    [`${p}.expert_shared_feed_forward_length`, gv.u32(m.nFfShexp)],
    [`${p}.expert_shared_count`, gv.u32(1)],
    [`${p}.expert_weights_norm`, gv.bool(true)],
    [`${p}.expert_weights_scale`, gv.f32(1)],
  ];
}

/** Router (f32), routing bias, routed experts without gate, and one shared expert. */
function moeFfn(t: TensorList, i: number, spec: ModelSpec): void {
  const m = spec.moe!;
  t.f32(`blk.${i}.ffn_gate_inp.weight`, [spec.nEmbd, m.nExpert], { kind: "normal", std: 0.02 });
  t.f32(`blk.${i}.exp_probs_b.bias`, [m.nExpert], { kind: "normal", std: 0.01 });
  t.matrix(`blk.${i}.ffn_up_exps.weight`, [spec.nEmbd, m.nFfExp, m.nExpert]);
  t.matrix(`blk.${i}.ffn_down_exps.weight`, [m.nFfExp, spec.nEmbd, m.nExpert]);
  t.matrix(`blk.${i}.ffn_up_shexp.weight`, [spec.nEmbd, m.nFfShexp]);
  t.matrix(`blk.${i}.ffn_down_shexp.weight`, [m.nFfShexp, spec.nEmbd]);
}

/** The nextn block: input fusion (enorm, hnorm, eh_proj), attention, MoE, final head norm. */
function mtpBlock(t: TensorList, i: number, spec: ModelSpec): void {
  t.norm(`blk.${i}.nextn.enorm.weight`, spec.nEmbd);
  t.norm(`blk.${i}.nextn.hnorm.weight`, spec.nEmbd);
  t.matrix(`blk.${i}.nextn.eh_proj.weight`, [2 * spec.nEmbd, spec.nEmbd]);
  t.norm(`blk.${i}.nextn.shared_head_norm.weight`, spec.nEmbd);
  t.norm(`blk.${i}.attn_norm.weight`, spec.nEmbd);
  attentionProjections(t, i, spec);
  t.norm(`blk.${i}.post_attention_norm.weight`, spec.nEmbd);
  moeFfn(t, i, spec);
}
