/**
 * What a model is, independent of its weights: architecture, layer pattern and dimensions.
 * The test families and presets are tables of these; `specFromGguf` rebuilds one from a file's
 * metadata; `expectedStateBytes` turns one into state sizes.
 */
import type { WeightType } from "./_gguf_types.ts";

export const FAMILIES = ["dense", "iswa", "recurrent", "hybrid", "hybrid-moe-mtp"] as const;
export type Family = typeof FAMILIES[number];

export const PRESETS = ["tiny", "super-mini", "lab-state"] as const;
export type Preset = typeof PRESETS[number];

/** llama.cpp architecture names (`general.architecture`) the families use. */
export type Architecture = "llama" | "gemma3" | "mamba2" | "nemotron_h" | "nemotron_h_moe";

/**
 * The kind of one trunk layer:
 * - `transformer`: attention + MLP in one block, global attention (llama, gemma3 global);
 * - `swa-transformer`: the same with sliding-window attention (gemma3 local layers);
 * - `mamba`: a Mamba2 mixer (recurrent conv + SSM state);
 * - `attention`, `mlp`, `moe`: Nemotron-H's single-purpose blocks.
 */
export type LayerKind = "transformer" | "swa-transformer" | "mamba" | "attention" | "mlp" | "moe";

/** One letter per layer kind for compact patterns (`MEMEM*E...` is written `MEMEMAE...`). */
export const LAYER_LETTERS: Readonly<Record<LayerKind, string>> = {
  transformer: "T",
  "swa-transformer": "S",
  mamba: "M",
  attention: "A",
  mlp: "F",
  moe: "E",
};
/** Letter for an appended nextn (MTP) block. */
export const MTP_LETTER = "P";

export interface AttentionDims {
  readonly nHead: number;
  readonly nHeadKv: number;
  readonly headDim: number;
  /** Tokens a sliding-window layer sees; absent for global-only models. */
  readonly slidingWindow?: number;
  /** Every `swaPeriod`-th layer is global, the others sliding-window (gemma3 style). */
  readonly swaPeriod?: number;
}

/** Mamba2 mixer dimensions (llama.cpp's `ssm.*` keys; `nHead` is `ssm.time_step_rank`). */
export interface SsmDims {
  readonly dConv: number;
  readonly dInner: number;
  readonly dState: number;
  readonly nGroup: number;
  readonly nHead: number;
}

export interface MoeDims {
  readonly nExpert: number;
  readonly nExpertUsed: number;
  readonly nFfExp: number;
  readonly nFfShexp: number;
}

export interface ModelSpec {
  readonly architecture: Architecture;
  /** Set for models made by this project (stored as `skippy.*` metadata). */
  readonly family?: Family;
  readonly preset?: Preset;
  readonly seed?: number;
  readonly contextLength: number;
  readonly nVocab: number;
  readonly nEmbd: number;
  /** Trunk layers in order (nextn/MTP blocks not included). */
  readonly layers: readonly LayerKind[];
  /** nextn (MTP) blocks appended after the trunk; `block_count` = trunk + these. */
  readonly nextnLayers: number;
  readonly attention?: AttentionDims;
  readonly ssm?: SsmDims;
  /** Hidden size of dense MLPs. */
  readonly nFf?: number;
  readonly moe?: MoeDims;
  /** Type of the large matrices; norms, SSM parameters and routers stay f32. */
  readonly weightType: WeightType;
}

/** The layer pattern as letters, e.g. `MFMAFMFMAF` or `MEMAE...P`. */
export function layerPattern(spec: Pick<ModelSpec, "layers" | "nextnLayers">): string {
  return spec.layers.map((kind) => LAYER_LETTERS[kind]).join("") +
    MTP_LETTER.repeat(spec.nextnLayers);
}

/** Parses a letter pattern back into layer kinds (nextn letters excluded). */
export function parsePattern(pattern: string): LayerKind[] {
  const byLetter = new Map(
    Object.entries(LAYER_LETTERS).map(([kind, letter]) => [letter, kind as LayerKind]),
  );
  return [...pattern].map((letter) => {
    const kind = byLetter.get(letter);
    if (kind === undefined) throw new Error(`Internal error: bad layer letter "${letter}"`);
    return kind;
  });
}

/** Counts of each layer kind. */
export function layerCounts(spec: Pick<ModelSpec, "layers">): Partial<Record<LayerKind, number>> {
  const counts: Partial<Record<LayerKind, number>> = {};
  for (const kind of spec.layers) counts[kind] = (counts[kind] ?? 0) + 1;
  return counts;
}

/** True for layers with attention KV in the main context. */
export function hasAttention(kind: LayerKind): boolean {
  return kind === "transformer" || kind === "swa-transformer" || kind === "attention";
}
