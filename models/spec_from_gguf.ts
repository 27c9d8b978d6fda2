/**
 * Rebuilds a `ModelSpec` from GGUF metadata, using the same rules llama.cpp applies when it
 * loads the file (layer kinds of Nemotron-H from the per-layer arrays, sliding-window layers
 * from the pattern). Works for the test families and, as far as a `ModelSpec` can describe
 * them, for real models of the same architectures; other architectures are read as plain
 * transformer stacks. Per-layer head counts that vary between attention layers are reduced to
 * their maximum.
 */
import { InputFileError } from "../core/errors.ts";
import type { WeightType } from "./_gguf_types.ts";
import type { GgufFileInfo, GgufReadScalar, GgufReadValue } from "./gguf_reader.ts";
import {
  type Architecture,
  type AttentionDims,
  FAMILIES,
  type Family,
  type LayerKind,
  type ModelSpec,
  type Preset,
  PRESETS,
  type SsmDims,
} from "./spec.ts";

/** Default sliding-window periods of the ISWA architectures llama.cpp knows. */
const SWA_PERIOD_DEFAULTS: Readonly<Record<string, number>> = { gemma3: 6, gemma2: 2, cohere2: 4 };

/** Reads typed values by key, with errors that name the file and the key. */
class Keys {
  constructor(readonly meta: ReadonlyMap<string, GgufReadValue>, readonly source: string) {}

  has(key: string): boolean {
    return this.meta.has(key);
  }

  missing(key: string, why = "it is required"): InputFileError {
    return new InputFileError(`GGUF file "${this.source}" lacks "${key}": ${why}`, {
      hint: "the file is not a complete model of its architecture",
    });
  }

  str(key: string): string | undefined {
    const v = this.meta.get(key)?.value;
    return typeof v === "string" ? v : undefined;
  }

  num(key: string): number | undefined {
    const v = this.meta.get(key)?.value;
    return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : undefined;
  }

  need(key: string): number {
    const v = this.num(key);
    if (v === undefined) throw this.missing(key);
    return v;
  }

  /** A per-layer value: an array of length `n`, or a scalar repeated. */
  perLayer(key: string, n: number, fallback?: number): number[] {
    const v = this.meta.get(key)?.value;
    if (Array.isArray(v)) return v.slice(0, n).map((x: GgufReadScalar) => Number(x));
    const scalar = this.num(key) ?? fallback;
    if (scalar === undefined) throw this.missing(key);
    return Array(n).fill(scalar);
  }
}

/** The spec described by a GGUF file's metadata and tensor infos. */
export function specFromGguf(info: GgufFileInfo, source = "input"): ModelSpec {
  const k = new Keys(info.metadata, source);
  const arch = k.str("general.architecture");
  if (arch === undefined) throw k.missing("general.architecture");
  const p = arch;
  const nLayerAll = k.need(`${p}.block_count`);
  const nextnLayers = k.num(`${p}.nextn_predict_layers`) ?? 0;
  const nTrunk = nLayerAll - nextnLayers;
  const nEmbd = k.need(`${p}.embedding_length`);
  const ssm = readSsm(k, p);
  const attention = readAttention(k, p, nEmbd, nLayerAll);
  const layers = layerKinds(k, arch, nTrunk, nLayerAll);
  const nFfs = k.perLayer(`${p}.feed_forward_length`, nLayerAll, 0);
  const nExpert = k.num(`${p}.expert_count`) ?? 0;
  return {
    architecture: arch as Architecture,
    ...skippyFields(k),
    contextLength: k.need(`${p}.context_length`),
    nVocab: vocabSize(k, p),
    nEmbd,
    layers,
    nextnLayers,
    ...(attention ? { attention } : {}),
    ...(ssm ? { ssm } : {}),
    ...(nExpert === 0 && Math.max(...nFfs) > 0 ? { nFf: Math.max(...nFfs) } : {}),
    ...(nExpert > 0 ? { moe: readMoe(k, p, nExpert, nFfs) } : {}),
    weightType: dominantWeightType(info),
  };
}

function layerKinds(k: Keys, arch: string, nTrunk: number, nAll: number): LayerKind[] {
  const p = arch;
  if (arch === "mamba" || arch === "mamba2") return Array(nTrunk).fill("mamba");
  if (arch === "nemotron_h" || arch === "nemotron_h_moe") {
    const kv = k.perLayer(`${p}.attention.head_count_kv`, nAll);
    const ff = k.perLayer(`${p}.feed_forward_length`, nAll);
    const ffnKind: LayerKind = (k.num(`${p}.expert_count`) ?? 0) > 0 ? "moe" : "mlp";
    return Array.from(
      { length: nTrunk },
      (_, i): LayerKind => ff[i] === 0 ? (kv[i] === 0 ? "mamba" : "attention") : ffnKind,
    );
  }
  const window = k.num(`${p}.attention.sliding_window`) ?? 0;
  const pattern = k.meta.get(`${p}.attention.sliding_window_pattern`)?.value;
  if (window > 0 && Array.isArray(pattern)) {
    return Array.from({ length: nTrunk }, (_, i) => pattern[i] ? "swa-transformer" : "transformer");
  }
  const period = k.num(`${p}.attention.sliding_window_pattern`) ?? SWA_PERIOD_DEFAULTS[arch];
  if (window > 0 && period !== undefined) {
    return Array.from(
      { length: nTrunk },
      (_, i) => period === 0 || i % period < period - 1 ? "swa-transformer" : "transformer",
    );
  }
  return Array(nTrunk).fill("transformer");
}

function readAttention(
  k: Keys,
  p: string,
  nEmbd: number,
  nAll: number,
): AttentionDims | undefined {
  if (!k.has(`${p}.attention.head_count`)) return undefined;
  const heads = k.perLayer(`${p}.attention.head_count`, nAll);
  const nHead = Math.max(...heads);
  if (nHead === 0) return undefined;
  const kvHeads = k.has(`${p}.attention.head_count_kv`)
    ? k.perLayer(`${p}.attention.head_count_kv`, nAll)
    : heads;
  const headDim = k.num(`${p}.attention.key_length`) ?? nEmbd / heads[0];
  const window = k.num(`${p}.attention.sliding_window`);
  const period = k.num(`${p}.attention.sliding_window_pattern`) ?? SWA_PERIOD_DEFAULTS[p];
  return {
    nHead,
    nHeadKv: Math.max(...kvHeads),
    headDim,
    ...(window ? { slidingWindow: window } : {}),
    ...(window && period !== undefined ? { swaPeriod: period } : {}),
  };
}

function readSsm(k: Keys, p: string): SsmDims | undefined {
  if (!k.has(`${p}.ssm.inner_size`)) return undefined;
  return {
    dConv: k.need(`${p}.ssm.conv_kernel`),
    dInner: k.need(`${p}.ssm.inner_size`),
    dState: k.need(`${p}.ssm.state_size`),
    nGroup: k.num(`${p}.ssm.group_count`) ?? 1,
    nHead: k.need(`${p}.ssm.time_step_rank`),
  };
}

function readMoe(k: Keys, p: string, nExpert: number, nFfs: number[]) {
  const nExpertUsed = Math.max(...k.perLayer(`${p}.expert_used_count`, 1, 0));
  return {
    nExpert,
    nExpertUsed,
    nFfExp: k.num(`${p}.expert_feed_forward_length`) ??
      Math.max(...nFfs) / Math.max(nExpertUsed, 1),
    nFfShexp: k.num(`${p}.expert_shared_feed_forward_length`) ?? 0,
  };
}

function vocabSize(k: Keys, p: string): number {
  const tokens = k.meta.get("tokenizer.ggml.tokens")?.value;
  if (Array.isArray(tokens)) return tokens.length;
  return k.num(`${p}.vocab_size`) ?? 0;
}

function skippyFields(k: Keys): { family?: Family; preset?: Preset; seed?: number } {
  const family = k.str("skippy.family");
  const preset = k.str("skippy.preset");
  const seed = k.num("skippy.seed");
  return {
    ...((FAMILIES as readonly string[]).includes(family ?? "") ? { family: family as Family } : {}),
    ...((PRESETS as readonly string[]).includes(preset ?? "") ? { preset: preset as Preset } : {}),
    ...(seed !== undefined ? { seed } : {}),
  };
}

/** "f16" when most matrix bytes are F16, else "f32" (other types are reported separately). */
function dominantWeightType(info: GgufFileInfo): WeightType {
  let f16 = 0;
  let other = 0;
  for (const t of info.tensors) {
    if (t.shape.length < 2) continue;
    if (t.typeName === "F16") f16 += t.bytes;
    else other += t.bytes;
  }
  return f16 > other ? "f16" : "f32";
}
