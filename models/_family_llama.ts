/**
 * `dense`: llama.cpp's `llama` architecture. Every layer is a transformer block (RMS norm,
 * grouped-query attention with RoPE, SwiGLU MLP). The output head is untied from the
 * embeddings so that logits depend on the whole hidden state, not mostly on the input token.
 */
import { assert } from "../core/errors.ts";
import { type GgufMetadata, gv } from "./gguf_writer.ts";
import type { ModelSpec } from "./spec.ts";
import { EMBEDDING_STD, TensorList } from "./_tensors.ts";

export const NORM_EPS = 1e-5;

/**
 * The dense test model's `tokenizer.chat_template` (the other families have none, so the API's
 * plain fallback is tested too). Its markers are plain text: the test vocabulary has no chat
 * special tokens. It starts with `bos_token`, as many real templates do.
 */
export const DENSE_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}" +
  "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

/** Architecture-specific metadata and tensors of a `llama` model. */
export function buildLlama(spec: ModelSpec): { metadata: GgufMetadata; tensors: TensorList } {
  const a = spec.attention;
  assert(a !== undefined && spec.nFf !== undefined, "dense spec needs attention and nFf");
  const p = "llama";
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
    [`${p}.rope.dimension_count`, gv.u32(a.headDim)],
    [`${p}.rope.freq_base`, gv.f32(10000)],
    [`${p}.vocab_size`, gv.u32(spec.nVocab)],
    ["tokenizer.chat_template", gv.str(DENSE_CHAT_TEMPLATE)],
  ];
  const t = new TensorList(spec.weightType);
  embeddingAndHead(t, spec);
  spec.layers.forEach((_, i) => {
    t.norm(`blk.${i}.attn_norm.weight`, spec.nEmbd);
    attentionProjections(t, i, spec);
    t.norm(`blk.${i}.ffn_norm.weight`, spec.nEmbd);
    t.matrix(`blk.${i}.ffn_gate.weight`, [spec.nEmbd, spec.nFf!]);
    t.matrix(`blk.${i}.ffn_up.weight`, [spec.nEmbd, spec.nFf!]);
    t.matrix(`blk.${i}.ffn_down.weight`, [spec.nFf!, spec.nEmbd]);
  });
  return { metadata, tensors: t };
}

/**
 * `token_embd`, `output_norm` and an untied `output` head. The head's rows of the special and
 * byte tokens are zero, so the random model writes word pieces, not stray bytes, and its text
 * stays readable as text (random-weight word soup).
 */
export function embeddingAndHead(t: TensorList, spec: ModelSpec): void {
  t.matrix("token_embd.weight", [spec.nEmbd, spec.nVocab], EMBEDDING_STD);
  t.norm("output_norm.weight", spec.nEmbd);
  t.plans.push({
    name: "output.weight",
    shape: [spec.nEmbd, spec.nVocab],
    type: t.weightType,
    init: {
      kind: "normal",
      std: EMBEDDING_STD,
      zeroRows: { first: 0, end: FIRST_PIECE_TOKEN, rowLength: spec.nEmbd },
    },
  });
}

/** Token ids below this are the 3 specials and the 256 byte tokens (see tokenizer.ts). */
const FIRST_PIECE_TOKEN = 3 + 256;

/** Separate Q, K, V and output projections of layer `i`. */
export function attentionProjections(t: TensorList, i: number, spec: ModelSpec): void {
  const a = spec.attention!;
  const q = a.nHead * a.headDim;
  const kv = a.nHeadKv * a.headDim;
  t.matrix(`blk.${i}.attn_q.weight`, [spec.nEmbd, q]);
  t.matrix(`blk.${i}.attn_k.weight`, [spec.nEmbd, kv]);
  t.matrix(`blk.${i}.attn_v.weight`, [spec.nEmbd, kv]);
  t.matrix(`blk.${i}.attn_output.weight`, [q, spec.nEmbd]);
}
