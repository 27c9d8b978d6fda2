/**
 * `recurrent`: llama.cpp's `mamba2` architecture, every layer a Mamba2 mixer. Its state is
 * fixed-size per sequence: a conv state of (d_conv - 1) x (d_inner + 2 n_group d_state) and an
 * SSM state of d_state x d_inner per layer, both f32.
 */
import { assert } from "../core/errors.ts";
import { type GgufMetadata, gv } from "./gguf_writer.ts";
import type { ModelSpec, SsmDims } from "./spec.ts";
import { TensorList } from "./_tensors.ts";
import { embeddingAndHead } from "./_family_llama.ts";

const NORM_EPS = 1e-5;

/** The `<arch>.ssm.*` keys. */
export function ssmMetadata(prefix: string, ssm: SsmDims): GgufMetadata {
  return [
    [`${prefix}.ssm.conv_kernel`, gv.u32(ssm.dConv)],
    [`${prefix}.ssm.inner_size`, gv.u32(ssm.dInner)],
    [`${prefix}.ssm.state_size`, gv.u32(ssm.dState)],
    [`${prefix}.ssm.time_step_rank`, gv.u32(ssm.nHead)],
    [`${prefix}.ssm.group_count`, gv.u32(ssm.nGroup)],
  ];
}

/**
 * The Mamba2 mixer tensors of layer `i` (without its pre-norm). The conv bias is declared
 * optional by nemotron_h, but omitting it crashes context creation, so it is always written.
 * A = -[1, 16) and dt biases in [-7, -2.3) (softplus gives dt in about [0.001, 0.1]) follow
 * Mamba2's initialisation, so the recurrence is stable and its state stays finite.
 */
export function mambaMixer(t: TensorList, i: number, spec: ModelSpec): void {
  const s = spec.ssm!;
  const convChannels = s.dInner + 2 * s.nGroup * s.dState;
  t.matrix(`blk.${i}.ssm_in.weight`, [
    spec.nEmbd,
    2 * s.dInner + 2 * s.nGroup * s.dState + s.nHead,
  ]);
  t.f32(`blk.${i}.ssm_conv1d.weight`, [s.dConv, convChannels], { kind: "normal", std: 0.1 });
  t.f32(`blk.${i}.ssm_conv1d.bias`, [convChannels], { kind: "normal", std: 0.02 });
  t.f32(`blk.${i}.ssm_dt.bias`, [s.nHead], { kind: "uniform", lo: -7, hi: -2.3 });
  t.f32(`blk.${i}.ssm_a`, [1, s.nHead], { kind: "uniform", lo: -16, hi: -1 });
  t.f32(`blk.${i}.ssm_d`, [1, s.nHead], { kind: "constant", value: 1 });
  t.f32(`blk.${i}.ssm_norm.weight`, [s.dInner / s.nGroup, s.nGroup], {
    kind: "constant",
    value: 1,
  });
  t.matrix(`blk.${i}.ssm_out.weight`, [s.dInner, spec.nEmbd]);
}

/** Checks the divisibility rules of llama.cpp's Mamba2 graph and ggml's ssm_scan. */
export function checkSsmDims(s: SsmDims): void {
  assert(s.dInner % s.nHead === 0, "d_inner must be a multiple of the SSM head count");
  assert(s.dInner % s.nGroup === 0, "d_inner must be a multiple of n_group");
  assert(s.nHead % s.nGroup === 0, "SSM head count must be a multiple of n_group");
  assert(s.dConv >= 2, "conv kernel must be at least 2");
}

/** Architecture-specific metadata and tensors of a `mamba2` model. */
export function buildMamba2(spec: ModelSpec): { metadata: GgufMetadata; tensors: TensorList } {
  assert(spec.ssm !== undefined, "recurrent spec needs ssm dims");
  checkSsmDims(spec.ssm);
  const p = "mamba2";
  const metadata: GgufMetadata = [
    [`${p}.context_length`, gv.u32(spec.contextLength)],
    [`${p}.embedding_length`, gv.u32(spec.nEmbd)],
    [`${p}.block_count`, gv.u32(spec.layers.length)],
    ...ssmMetadata(p, spec.ssm),
    [`${p}.attention.layer_norm_rms_epsilon`, gv.f32(NORM_EPS)],
  ];
  const t = new TensorList(spec.weightType);
  embeddingAndHead(t, spec);
  spec.layers.forEach((_, i) => {
    t.norm(`blk.${i}.attn_norm.weight`, spec.nEmbd);
    mambaMixer(t, i, spec);
  });
  return { metadata, tensors: t };
}
