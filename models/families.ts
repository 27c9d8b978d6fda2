/**
 * The random-weight test model families and their presets, and `makeModel`, which turns a
 * (family, preset, seed) into a GGUF byte stream. The same triple always gives the same bytes.
 *
 * Presets: `tiny` is for tests (about 1 M parameters, f32, fast on two cores). `super-mini`
 * keeps Nemotron 3 Super's proportions for the hybrid families: the layer pattern (40 Mamba :
 * 8 attention : 40 MoE scaled to 10 : 2 : 10, interleaved as in Nemotron-H) and the ratio of
 * fixed recurrent bytes to attention-KV bytes per token (about 20K tokens of F16 KV). For the
 * other families super-mini is simply a larger model, stored as f16. `lab-state` (hybrid
 * families only) has Nemotron 3 Super's real 88-layer pattern and its exact per-sequence state
 * dimensions on a 64-wide residual stream, so state sizes are real while compute stays small.
 */
import { UsageError } from "../core/errors.ts";
import {
  type GgufLayout,
  type GgufMetadata,
  type GgufTensor,
  gv,
  layoutGguf,
} from "./gguf_writer.ts";
import { elementCount, encodeGguf } from "./gguf_writer.ts";
import { buildSpmVocab, tokenizerMetadata } from "./tokenizer.ts";
import {
  FAMILIES,
  type Family,
  layerPattern,
  type ModelSpec,
  parsePattern,
  type Preset,
  PRESETS,
} from "./spec.ts";
import { planToTensor, type TensorList } from "./_tensors.ts";
import { buildLlama } from "./_family_llama.ts";
import { buildGemma3 } from "./_family_gemma3.ts";
import { buildMamba2 } from "./_family_mamba2.ts";
import { buildNemotronH } from "./_family_nemotron_h.ts";

export { FAMILIES, PRESETS };
export type { Family, Preset };

const N_VOCAB = buildSpmVocab().tokens.length;

type PresetSpec = Omit<ModelSpec, "nVocab" | "seed">;
/** `tiny` and `super-mini` exist for every family; `lab-state` only for the hybrid ones. */
type SpecTable = Record<
  Family,
  Record<"tiny" | "super-mini", PresetSpec> & Partial<Record<Preset, PresetSpec>>
>;

const TINY_SSM = { dConv: 4, dInner: 256, dState: 16, nGroup: 1, nHead: 8 };
const TINY_ATTN = { nHead: 4, nHeadKv: 2, headDim: 32 };
/** Super-mini Mamba2 mixer: d_inner = 2 n_embd and 16 heads per group, as in the real model. */
const SUPER_SSM = { dConv: 4, dInner: 1024, dState: 256, nGroup: 1, nHead: 16 };
/** Super-mini attention: GQA 8:1 with 2 KV heads, as in the real model. */
const SUPER_ATTN = { nHead: 16, nHeadKv: 2, headDim: 32 };
/** Nemotron 3 Super's 88-layer pattern at 1/4 scale (real: 40 M, 8 A, 40 E). */
const SUPER_PATTERN = "MEMEMAEMEMEMEMAEMEMEME";

/**
 * Nemotron 3 Super's `hybrid_override_pattern` (config.json of
 * nvidia/NVIDIA-Nemotron-3-Super-120B-A12B, `num_hidden_layers` 88), with `*` written `A`:
 * 40 Mamba2, 40 MoE and 8 attention layers, attention at 7, 16, 25, 36, 47, 58, 69 and 78. Its
 * MTP block (`mtp_hybrid_override_pattern` "*E") is attention + MoE, our nextn block.
 */
export const NEMOTRON_3_SUPER_PATTERN =
  "MEMEMEMAEMEMEMEMAEMEMEMEMAEMEMEMEMEMAEMEMEMEMEMAEMEMEMEMEMAEMEMEMEMEMAEMEMEMEMAEMEMEMEME";
/**
 * Nemotron 3 Super's exact per-sequence state dimensions: Mamba2 d_inner 8192 (128 heads x 64),
 * d_state 128, 8 groups, conv kernel 4; attention 32 query heads, 2 KV heads x 128. With 40
 * Mamba and 8 attention layers: 172,687,360 B recurrent state, 8,192 B/token of F16 KV.
 */
const LAB_SSM = { dConv: 4, dInner: 8192, dState: 128, nGroup: 8, nHead: 128 };
const LAB_ATTN = { nHead: 32, nHeadKv: 2, headDim: 128 };
/** Residual width of lab-state: tiny, so the f16 file stays near 150 MiB. */
const LAB_EMBD = 64;

const SPECS: SpecTable = {
  dense: {
    tiny: {
      architecture: "llama",
      contextLength: 32768,
      nEmbd: 128,
      layers: parsePattern("TTTT"),
      nextnLayers: 0,
      attention: TINY_ATTN,
      nFf: 384,
      weightType: "f32",
    },
    "super-mini": {
      architecture: "llama",
      contextLength: 65536,
      nEmbd: 512,
      layers: parsePattern("T".repeat(8)),
      nextnLayers: 0,
      attention: { nHead: 8, nHeadKv: 2, headDim: 64 },
      nFf: 1408,
      weightType: "f16",
    },
  },
  iswa: {
    tiny: {
      architecture: "gemma3",
      contextLength: 32768,
      nEmbd: 128,
      layers: parsePattern("SSSSST"),
      nextnLayers: 0,
      attention: { ...TINY_ATTN, slidingWindow: 128, swaPeriod: 6 },
      nFf: 256,
      weightType: "f32",
    },
    "super-mini": {
      architecture: "gemma3",
      contextLength: 65536,
      nEmbd: 512,
      layers: parsePattern("SSSSSTSSSSST"),
      nextnLayers: 0,
      attention: { nHead: 8, nHeadKv: 2, headDim: 64, slidingWindow: 512, swaPeriod: 6 },
      nFf: 1024,
      weightType: "f16",
    },
  },
  recurrent: {
    tiny: {
      architecture: "mamba2",
      contextLength: 32768,
      nEmbd: 128,
      layers: parsePattern("MMMMMM"),
      nextnLayers: 0,
      ssm: TINY_SSM,
      weightType: "f32",
    },
    "super-mini": {
      architecture: "mamba2",
      contextLength: 65536,
      nEmbd: 512,
      layers: parsePattern("M".repeat(12)),
      nextnLayers: 0,
      ssm: { dConv: 4, dInner: 1024, dState: 128, nGroup: 1, nHead: 16 },
      weightType: "f16",
    },
  },
  hybrid: {
    tiny: {
      architecture: "nemotron_h",
      contextLength: 65536,
      nEmbd: 128,
      layers: parsePattern("MFMAFMFMAF"),
      nextnLayers: 0,
      attention: TINY_ATTN,
      ssm: TINY_SSM,
      nFf: 256,
      weightType: "f32",
    },
    "super-mini": {
      architecture: "nemotron_h",
      contextLength: 262144,
      nEmbd: 512,
      layers: parsePattern(SUPER_PATTERN.replaceAll("E", "F")),
      nextnLayers: 0,
      attention: SUPER_ATTN,
      ssm: SUPER_SSM,
      nFf: 1024,
      weightType: "f16",
    },
    "lab-state": {
      architecture: "nemotron_h",
      contextLength: 262144,
      nEmbd: LAB_EMBD,
      layers: parsePattern(NEMOTRON_3_SUPER_PATTERN.replaceAll("E", "F")),
      nextnLayers: 0,
      attention: LAB_ATTN,
      ssm: LAB_SSM,
      nFf: 128,
      weightType: "f16",
    },
  },
  "hybrid-moe-mtp": {
    tiny: {
      architecture: "nemotron_h_moe",
      contextLength: 65536,
      nEmbd: 128,
      layers: parsePattern("MEMAEMEMAE"),
      nextnLayers: 1,
      attention: TINY_ATTN,
      ssm: TINY_SSM,
      moe: { nExpert: 4, nExpertUsed: 2, nFfExp: 64, nFfShexp: 128 },
      weightType: "f32",
    },
    "super-mini": {
      architecture: "nemotron_h_moe",
      contextLength: 262144,
      nEmbd: 512,
      layers: parsePattern(SUPER_PATTERN),
      nextnLayers: 1,
      attention: SUPER_ATTN,
      ssm: SUPER_SSM,
      moe: { nExpert: 8, nExpertUsed: 2, nFfExp: 128, nFfShexp: 256 },
      weightType: "f16",
    },
    "lab-state": {
      architecture: "nemotron_h_moe",
      contextLength: 262144,
      nEmbd: LAB_EMBD,
      layers: parsePattern(NEMOTRON_3_SUPER_PATTERN),
      nextnLayers: 1,
      attention: LAB_ATTN,
      ssm: LAB_SSM,
      moe: { nExpert: 4, nExpertUsed: 2, nFfExp: 32, nFfShexp: 64 },
      weightType: "f16",
    },
  },
};

/** The presets `family` has, in PRESETS order. */
export function presetsOf(family: Family): Preset[] {
  return PRESETS.filter((preset) => SPECS[family][preset] !== undefined);
}

export const SEED_MAX = 0xffffffff;

/**
 * Bump when the bytes `makeModel` produces for some (family, preset, seed) change: the
 * vocabulary, a preset's dimensions, the tensor list or the random streams. It is stored in
 * the file (`skippy.generator_version`) and in cached file names.
 */
export const GENERATOR_VERSION = 2;

/** The spec of a family at a preset. Unknown names are a `UsageError` listing valid ones. */
export function familySpec(family: string, preset: string = "tiny", seed = 0): ModelSpec {
  if (!(FAMILIES as readonly string[]).includes(family)) {
    throw new UsageError(`Unknown model family "${family}"`, {
      hint: `use one of: ${FAMILIES.join(", ")}`,
    });
  }
  if (!(PRESETS as readonly string[]).includes(preset)) {
    throw new UsageError(`Unknown preset "${preset}"`, {
      hint: `use one of: ${PRESETS.join(", ")}`,
    });
  }
  if (!Number.isInteger(seed) || seed < 0 || seed > SEED_MAX) {
    throw new UsageError(`Invalid seed "${seed}"`, {
      hint: `use an integer from 0 to ${SEED_MAX}`,
    });
  }
  const base = SPECS[family as Family][preset as Preset];
  if (base === undefined) {
    const families = FAMILIES.filter((f) => presetsOf(f).includes(preset as Preset));
    throw new UsageError(`Preset "${preset}" does not exist for family "${family}"`, {
      hint: `it exists for: ${families.join(", ")}`,
    });
  }
  return { ...base, family: family as Family, preset: preset as Preset, seed, nVocab: N_VOCAB };
}

export interface MadeModel {
  readonly spec: ModelSpec;
  readonly metadata: GgufMetadata;
  readonly tensors: readonly GgufTensor[];
  readonly layout: GgufLayout;
  readonly paramCount: number;
  /** The whole file; iterate it (sync or async) as many times as needed. */
  readonly chunks: AsyncIterable<Uint8Array> & Iterable<Uint8Array>;
}

/** Builds a model's metadata and lazy tensors; no weight is generated until `chunks` is read. */
export function makeModel(
  options: { family: string; preset?: string; seed?: number },
): MadeModel {
  const spec = familySpec(options.family, options.preset, options.seed);
  const built = buildArchitecture(spec);
  const metadata: GgufMetadata = [
    ...commonMetadata(spec),
    ...built.metadata,
    ...tokenizerMetadata(),
  ];
  const tensors = built.tensors.plans.map((plan) => planToTensor(plan, spec.seed!));
  const layout = layoutGguf(metadata, tensors);
  const paramCount = tensors.reduce((sum, t) => sum + elementCount(t.shape), 0);
  const chunks = {
    [Symbol.iterator]: () => encodeGguf(metadata, tensors),
    async *[Symbol.asyncIterator]() {
      yield* encodeGguf(metadata, tensors);
    },
  };
  return { spec, metadata, tensors, layout, paramCount, chunks };
}

function buildArchitecture(spec: ModelSpec): { metadata: GgufMetadata; tensors: TensorList } {
  switch (spec.architecture) {
    case "llama":
      return buildLlama(spec);
    case "gemma3":
      return buildGemma3(spec);
    case "mamba2":
      return buildMamba2(spec);
    case "nemotron_h":
    case "nemotron_h_moe":
      return buildNemotronH(spec);
  }
}

function commonMetadata(spec: ModelSpec): GgufMetadata {
  return [
    ["general.architecture", gv.str(spec.architecture)],
    ["general.name", gv.str(`skippy ${spec.family} ${spec.preset} seed ${spec.seed}`)],
    ["general.alignment", gv.u32(32)],
    ["general.file_type", gv.u32(spec.weightType === "f32" ? 0 : 1)],
    ["skippy.family", gv.str(spec.family!)],
    ["skippy.preset", gv.str(spec.preset!)],
    ["skippy.seed", gv.u32(spec.seed!)],
    ["skippy.generator_version", gv.u32(GENERATOR_VERSION)],
    ["skippy.layer_pattern", gv.str(layerPattern(spec))],
  ];
}
