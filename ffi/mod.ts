/**
 * The llama.cpp runtime: a checked one-to-one binding (`llama.ts`, `library.ts`) and the safe,
 * disposable wrapper one layer up. Knows no network.
 */
export {
  cString,
  llamaBuild,
  type LlamaLibrary,
  loadLlama,
  type LoadOptions,
  readCString,
} from "./library.ts";
export {
  GGML_TYPE,
  type KvType,
  LLAMA_CPP_RELEASE,
  LLAMA_PACKAGE_VERSION,
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY,
} from "./llama.ts";
export { LlamaModel, type ModelInfo, type ModelLoadOptions } from "./model.ts";
export {
  type BackendDevice,
  CPU_OFFLOAD,
  type DeviceType,
  type GpuLayersRequest,
  listDevices,
  type Offload,
  offloadDevices,
} from "./devices.ts";
export { type ContextOptions, LlamaContext, NUMERIC_DEFAULTS } from "./context.ts";
export { LlamaBatch } from "./batch.ts";
export { PieceDecoder, Vocab } from "./vocab.ts";
export { fileDigest, tokenizerDigest } from "./digest.ts";
export {
  exportKvPage,
  exportMtpHidden,
  exportRecurrent,
  exportSwa,
  joinRecurrent,
  type MemoryKind,
  type PageSummary,
  type RecurrentSnapshot,
  snapshotPosition,
  splitRecurrent,
  type StateBackend,
  stateBackend,
  type StateOptions,
  type StatePath,
  summarizePage,
} from "./state.ts";
export {
  type CommittedImport,
  type ImportState,
  StagedImport,
  type StagedImportOptions,
} from "./staged_import.ts";
export {
  argmax,
  type ExportedState,
  greedyLogits,
  importExported,
  type ImportOptions,
  type ImportResult,
  prefillAndExport,
  type PrefillOptions,
} from "./state_driver.ts";
export { MtpDraft } from "./mtp.ts";
export { recurrentPayloadBytes } from "./_recurrent_split.ts";
export { LlamaSampler, type LlamaSamplerOptions } from "./sampler.ts";
export {
  glibcTunablesWithHugePages,
  type HugePageAdvice,
  MALLOC_HUGE_PAGES_TUNABLE,
  mallocHugePages,
  mallocHugePagesAsked,
  memoryPaging,
} from "./huge_pages.ts";
