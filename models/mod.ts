/**
 * GGUF writing and reading, and the random-weight test model families.
 *
 * Reading order: `spec.ts` (what a model is), `families.ts` (the presets and `makeModel`),
 * `state_sizes.ts` (the state a model implies), `gguf_writer.ts` / `gguf_reader.ts` (the
 * format), `gguf_file.ts` (the file edge), `tokenizer.ts`, then the `_family_*.ts` builders.
 */
export {
  FAMILIES,
  type Family,
  familySpec,
  GENERATOR_VERSION,
  type MadeModel,
  makeModel,
  NEMOTRON_3_SUPER_PATTERN,
  type Preset,
  PRESETS,
  presetsOf,
  SEED_MAX,
} from "./families.ts";
export {
  type Architecture,
  type AttentionDims,
  hasAttention,
  LAYER_LETTERS,
  layerCounts,
  type LayerKind,
  layerPattern,
  type ModelSpec,
  type MoeDims,
  MTP_LETTER,
  type SsmDims,
} from "./spec.ts";
export {
  expectedStateBytes,
  KV_TYPES,
  kvRowBytes,
  type KvType,
  type StateBytes,
} from "./state_sizes.ts";
export { specFromGguf } from "./spec_from_gguf.ts";
export {
  elementCount,
  encodeGguf,
  type GgufEncodeOptions,
  type GgufLayout,
  type GgufMetadata,
  type GgufTensor,
  type GgufValue,
  gv,
  layoutGguf,
} from "./gguf_writer.ts";
export {
  type GgufFileInfo,
  type GgufReadLimits,
  type GgufReadValue,
  type GgufTensorInfo,
  parseGgufHeader,
} from "./gguf_reader.ts";
export {
  type GgufFileHeader,
  readGgufFile,
  writeChunksToFile,
  type WriteProgress,
} from "./gguf_file.ts";
export {
  BOS_ID,
  buildSpmVocab,
  EOS_ID,
  type SpmVocab,
  tokenizerMetadata,
  UNK_ID,
} from "./tokenizer.ts";
export type { WeightType } from "./_gguf_types.ts";
export { cachedModelName, ensureModelFile, type ModelRequest } from "./cache.ts";
export { syntheticTokens } from "./tokenizer.ts";
export { DENSE_CHAT_TEMPLATE } from "./_family_llama.ts";
