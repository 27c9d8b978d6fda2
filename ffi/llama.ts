/**
 * One-to-one binding of the llama.cpp C API (llama.h and the exported parts of llama-ext.h) of
 * the pinned build, llama.cpp v0.4.0 as shipped in `@node-llama-cpp/<platform>@3.21.1`.
 *
 * Names and struct layouts mirror the header exactly; nothing here is safe to call directly
 * from product code. The safe wrapper (model.ts, context.ts, batch.ts, sampler.ts, vocab.ts)
 * sits one layer up. Calls that run model compute are `nonblocking` so the event loop keeps
 * moving state while the model computes.
 *
 * If you change this file, re-read the struct definitions in `include/llama.h` of the bundled
 * source (see ffi/README.md); `library.ts` asserts the struct sizes at load.
 */
import { StructLayout } from "./_struct.ts";

/** The llama.cpp release these bindings were written against. */
export const LLAMA_CPP_RELEASE = "v0.4.0";
/** The npm package version of `@node-llama-cpp/<platform>` that ships that release. */
export const LLAMA_PACKAGE_VERSION = "3.21.1";

export const LLAMA_DEFAULT_SEED = 0xFFFFFFFF;
export const LLAMA_TOKEN_NULL = -1;
export const LLAMA_STATE_SEQ_FLAGS_NONE = 0;
/** Only the partial (recurrent / SWA) part of a sequence state. */
export const LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY = 1;

export const LLAMA_FLASH_ATTN_TYPE = { AUTO: -1, DISABLED: 0, ENABLED: 1 } as const;
export const LLAMA_CONTEXT_TYPE = { DEFAULT: 0, MTP: 1 } as const;
export const LLAMA_LOAD_MODE = { AUTO: -1, NONE: 0, MMAP: 1 } as const;
export const LLAMA_VOCAB_TYPE = ["none", "spm", "bpe", "wpm", "ugm", "rwkv", "plamo2"] as const;

/** `enum ggml_type` values for the K/V cache types we expose (one table, in core/). */
export { KV_CACHE_TYPES as GGML_TYPE, type KvType } from "../core/kv_types.ts";

export const llama_model_params = new StructLayout(
  "llama_model_params",
  [
    ["devices", "pointer"],
    ["tensor_buft_overrides", "pointer"],
    ["n_gpu_layers", "i32"],
    ["split_mode", "i32"],
    ["load_mode", "i32"],
    ["lazy_mode", "i32"],
    ["main_gpu", "i32"],
    ["tensor_split", "pointer"],
    ["progress_callback", "function"],
    ["progress_callback_user_data", "pointer"],
    ["kv_overrides", "pointer"],
    ["vocab_only", "bool"],
    ["check_tensors", "bool"],
    ["use_extra_bufts", "bool"],
    ["no_host", "bool"],
    ["no_alloc", "bool"],
    ["load_mtp", "bool"],
  ] as const,
);

export const llama_context_params = new StructLayout(
  "llama_context_params",
  [
    ["n_ctx", "u32"],
    ["n_batch", "u32"],
    ["n_ubatch", "u32"],
    ["n_seq_max", "u32"],
    ["n_rs_seq", "u32"],
    ["n_outputs_max", "u32"],
    ["n_outputs_max_per_seq", "u32"],
    ["n_threads", "i32"],
    ["n_threads_batch", "i32"],
    ["ctx_type", "i32"],
    ["rope_scaling_type", "i32"],
    ["pooling_type", "i32"],
    ["attention_type", "i32"],
    ["flash_attn_type", "i32"],
    ["rope_freq_base", "f32"],
    ["rope_freq_scale", "f32"],
    ["yarn_ext_factor", "f32"],
    ["yarn_attn_factor", "f32"],
    ["yarn_beta_fast", "f32"],
    ["yarn_beta_slow", "f32"],
    ["yarn_orig_ctx", "u32"],
    ["defrag_thold", "f32"],
    ["cb_eval", "function"],
    ["cb_eval_user_data", "pointer"],
    ["type_k", "i32"],
    ["type_v", "i32"],
    ["abort_callback", "function"],
    ["abort_callback_data", "pointer"],
    ["embeddings", "bool"],
    ["offload_kqv", "bool"],
    ["no_perf", "bool"],
    ["op_offload", "bool"],
    ["swa_full", "bool"],
    ["kv_unified", "bool"],
    ["samplers", "pointer"],
    ["n_samplers", "usize"],
    ["ctx_other", "pointer"],
  ] as const,
);

export const llama_batch = new StructLayout(
  "llama_batch",
  [
    ["n_tokens", "i32"],
    ["token", "pointer"],
    ["embd", "pointer"],
    ["pos", "pointer"],
    ["n_seq_id", "pointer"],
    ["seq_id", "pointer"],
    ["logits", "pointer"],
  ] as const,
);

export const llama_sampler_chain_params = new StructLayout(
  "llama_sampler_chain_params",
  [
    ["no_perf", "bool"],
  ] as const,
);

export const llama_perf_context_data = new StructLayout(
  "llama_perf_context_data",
  [
    ["t_start_ms", "f64"],
    ["t_load_ms", "f64"],
    ["t_p_eval_ms", "f64"],
    ["t_eval_ms", "f64"],
    ["n_p_eval", "i32"],
    ["n_eval", "i32"],
    ["n_reused", "i32"],
  ] as const,
);

/** Struct sizes measured from the header on LP64 platforms, asserted at load. */
export const EXPECTED_STRUCT_SIZES = {
  llama_model_params: 80,
  llama_context_params: 160,
  llama_batch: 56,
} as const;

const P = "pointer" as const;
const BUF = "buffer" as const;
const MODEL_PARAMS = llama_model_params.ffi;
const CONTEXT_PARAMS = llama_context_params.ffi;
const BATCH = llama_batch.ffi;

/** `libllama` symbols. Keys are C names; mangled C++ names are given with `name`. */
export const LLAMA_SYMBOLS = {
  // Versions, backend, logging
  llama_version: { parameters: [], result: P },
  llama_print_system_info: { parameters: [], result: P },
  llama_backend_init: { parameters: [], result: "void" },
  llama_backend_free: { parameters: [], result: "void" },
  llama_log_set: { parameters: ["function", P], result: "void" },
  llama_time_us: { parameters: [], result: "i64" },
  llama_max_devices: { parameters: [], result: "usize" },
  llama_supports_mmap: { parameters: [], result: "bool" },
  llama_supports_gpu_offload: { parameters: [], result: "bool" },
  llama_flash_attn_type_name: { parameters: ["i32"], result: P },

  // Defaults
  llama_model_default_params: { parameters: [], result: MODEL_PARAMS },
  llama_context_default_params: { parameters: [], result: CONTEXT_PARAMS },
  llama_sampler_chain_default_params: { parameters: [], result: llama_sampler_chain_params.ffi },

  // Model
  llama_model_load_from_file: {
    parameters: [BUF, MODEL_PARAMS],
    result: P,
    nonblocking: true,
  },
  llama_model_free: { parameters: [P], result: "void" },
  llama_model_get_vocab: { parameters: [P], result: P },
  llama_model_rope_type: { parameters: [P], result: "i32" },
  llama_model_n_ctx_train: { parameters: [P], result: "i32" },
  llama_model_n_embd: { parameters: [P], result: "i32" },
  llama_model_n_embd_inp: { parameters: [P], result: "i32" },
  llama_model_n_embd_out: { parameters: [P], result: "i32" },
  llama_model_n_layer: { parameters: [P], result: "i32" },
  llama_model_n_layer_nextn: { parameters: [P], result: "i32" },
  llama_model_n_head: { parameters: [P], result: "i32" },
  llama_model_n_head_kv: { parameters: [P], result: "i32" },
  llama_model_n_swa: { parameters: [P], result: "i32" },
  llama_model_meta_val_str: { parameters: [P, BUF, BUF, "usize"], result: "i32" },
  llama_model_meta_count: { parameters: [P], result: "i32" },
  llama_model_meta_key_by_index: { parameters: [P, "i32", BUF, "usize"], result: "i32" },
  llama_model_meta_val_str_by_index: { parameters: [P, "i32", BUF, "usize"], result: "i32" },
  llama_model_desc: { parameters: [P, BUF, "usize"], result: "i32" },
  llama_model_ftype: { parameters: [P], result: "i32" },
  llama_model_size: { parameters: [P], result: "u64" },
  llama_model_n_params: { parameters: [P], result: "u64" },
  llama_model_has_encoder: { parameters: [P], result: "bool" },
  llama_model_has_decoder: { parameters: [P], result: "bool" },
  llama_model_is_recurrent: { parameters: [P], result: "bool" },
  llama_model_is_hybrid: { parameters: [P], result: "bool" },
  llama_model_is_diffusion: { parameters: [P], result: "bool" },
  llama_ftype_name: { parameters: ["i32"], result: P },

  // Context
  llama_init_from_model: { parameters: [P, CONTEXT_PARAMS], result: P, nonblocking: true },
  llama_free: { parameters: [P], result: "void" },
  llama_n_ctx: { parameters: [P], result: "u32" },
  llama_n_ctx_seq: { parameters: [P], result: "u32" },
  llama_n_batch: { parameters: [P], result: "u32" },
  llama_n_ubatch: { parameters: [P], result: "u32" },
  llama_n_seq_max: { parameters: [P], result: "u32" },
  llama_n_rs_seq: { parameters: [P], result: "u32" },
  llama_get_model: { parameters: [P], result: P },
  llama_get_memory: { parameters: [P], result: P },
  llama_set_n_threads: { parameters: [P, "i32", "i32"], result: "void" },
  llama_attach_threadpool: { parameters: [P, P, P], result: "void" },
  llama_detach_threadpool: { parameters: [P], result: "void" },
  llama_n_threads: { parameters: [P], result: "i32" },
  llama_n_threads_batch: { parameters: [P], result: "i32" },
  llama_set_embeddings: { parameters: [P, "bool"], result: "void" },
  llama_set_causal_attn: { parameters: [P, "bool"], result: "void" },
  llama_synchronize: { parameters: [P], result: "void" },

  // Memory (KV cache / recurrent state)
  llama_memory_clear: { parameters: [P, "bool"], result: "void" },
  llama_memory_seq_rm: { parameters: [P, "i32", "i32", "i32"], result: "bool" },
  llama_memory_seq_cp: { parameters: [P, "i32", "i32", "i32", "i32"], result: "void" },
  llama_memory_seq_keep: { parameters: [P, "i32"], result: "void" },
  llama_memory_seq_add: { parameters: [P, "i32", "i32", "i32", "i32"], result: "void" },
  llama_memory_seq_pos_min: { parameters: [P, "i32"], result: "i32" },
  llama_memory_seq_pos_max: { parameters: [P, "i32"], result: "i32" },
  llama_memory_can_shift: { parameters: [P], result: "bool" },

  // State (whole context and per sequence)
  llama_state_get_size: { parameters: [P], result: "usize" },
  llama_state_get_data: { parameters: [P, BUF, "usize"], result: "usize" },
  llama_state_set_data: { parameters: [P, BUF, "usize"], result: "usize" },
  llama_state_seq_get_size: { parameters: [P, "i32"], result: "usize" },
  llama_state_seq_get_data: { parameters: [P, BUF, "usize", "i32"], result: "usize" },
  llama_state_seq_set_data: { parameters: [P, BUF, "usize", "i32"], result: "usize" },
  llama_state_seq_get_size_ext: { parameters: [P, "i32", "u32"], result: "usize" },
  llama_state_seq_get_data_ext: {
    parameters: [P, BUF, "usize", "i32", "u32"],
    result: "usize",
    nonblocking: true,
  },
  llama_state_seq_set_data_ext: {
    parameters: [P, BUF, "usize", "i32", "u32"],
    result: "usize",
    nonblocking: true,
  },

  // Batch and decode
  llama_batch_init: { parameters: ["i32", "i32", "i32"], result: BATCH },
  llama_batch_free: { parameters: [BATCH], result: "void" },
  llama_decode: { parameters: [P, BATCH], result: "i32", nonblocking: true },
  llama_get_logits: { parameters: [P], result: P },
  llama_get_logits_ith: { parameters: [P, "i32"], result: P },
  llama_get_embeddings: { parameters: [P], result: P },
  llama_get_embeddings_ith: { parameters: [P, "i32"], result: P },

  // Vocabulary and tokenizer
  llama_vocab_type: { parameters: [P], result: "i32" },
  llama_vocab_n_tokens: { parameters: [P], result: "i32" },
  llama_vocab_get_text: { parameters: [P, "i32"], result: P },
  llama_vocab_is_eog: { parameters: [P, "i32"], result: "bool" },
  llama_vocab_is_control: { parameters: [P, "i32"], result: "bool" },
  llama_vocab_bos: { parameters: [P], result: "i32" },
  llama_vocab_eos: { parameters: [P], result: "i32" },
  llama_vocab_get_add_bos: { parameters: [P], result: "bool" },
  llama_tokenize: {
    parameters: [P, BUF, "i32", BUF, "i32", "bool", "bool"],
    result: "i32",
  },
  llama_token_to_piece: { parameters: [P, "i32", BUF, "i32", "i32", "bool"], result: "i32" },
  llama_detokenize: {
    parameters: [P, BUF, "i32", BUF, "i32", "bool", "bool"],
    result: "i32",
  },

  // Samplers
  llama_sampler_chain_init: { parameters: [llama_sampler_chain_params.ffi], result: P },
  llama_sampler_chain_add: { parameters: [P, P], result: "void" },
  llama_sampler_chain_n: { parameters: [P], result: "i32" },
  llama_sampler_init_greedy: { parameters: [], result: P },
  llama_sampler_init_dist: { parameters: ["u32"], result: P },
  llama_sampler_init_top_k: { parameters: ["i32"], result: P },
  llama_sampler_init_top_p: { parameters: ["f32", "usize"], result: P },
  llama_sampler_init_min_p: { parameters: ["f32", "usize"], result: P },
  llama_sampler_init_temp: { parameters: ["f32"], result: P },
  llama_sampler_name: { parameters: [P], result: P },
  llama_sampler_accept: { parameters: [P, "i32"], result: "void" },
  llama_sampler_reset: { parameters: [P], result: "void" },
  llama_sampler_free: { parameters: [P], result: "void" },
  llama_sampler_get_seed: { parameters: [P], result: "u32" },
  llama_sampler_sample: { parameters: [P, P, "i32"], result: "i32" },

  // Performance counters
  llama_perf_context: { parameters: [P], result: llama_perf_context_data.ffi },
  llama_perf_context_reset: { parameters: [P], result: "void" },

  // llama-ext.h (C++ linkage, exported; Itanium mangling on Linux and macOS)
  llama_set_embeddings_nextn: {
    name: "_Z26llama_set_embeddings_nextnP13llama_contextbb",
    parameters: [P, "bool", "bool"],
    result: "void",
  },
  llama_set_nextn_layer_offset: {
    name: "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
    parameters: [P, "i32"],
    result: "void",
  },
  llama_get_embeddings_nextn: {
    name: "_Z26llama_get_embeddings_nextnP13llama_context",
    parameters: [P],
    result: P,
  },
  llama_get_embeddings_nextn_ith: {
    name: "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
    parameters: [P, "i32"],
    result: P,
  },
  llama_get_ctx_other: {
    name: "_Z19llama_get_ctx_otherP13llama_context",
    parameters: [P],
    result: P,
  },
  llama_model_n_expert: {
    name: "_Z20llama_model_n_expertPK11llama_model",
    parameters: [P],
    result: "i32",
  },
} as const satisfies Deno.ForeignLibraryInterface;

/** `libggml` symbols needed to load backends (the CPU backend is a separate plug-in). */
export const GGML_SYMBOLS = {
  ggml_backend_load: { parameters: [BUF], result: P },
  ggml_backend_reg_count: { parameters: [], result: "usize" },
  ggml_backend_dev_count: { parameters: [], result: "usize" },
  ggml_backend_dev_get: { parameters: ["usize"], result: P },
} as const satisfies Deno.ForeignLibraryInterface;

/** `enum ggml_backend_dev_type` (ggml-backend.h), in order. */
export const GGML_BACKEND_DEVICE_TYPE = ["cpu", "gpu", "igpu", "accel", "meta"] as const;

/** `libggml-base` symbols for type names and sizes, and the backend device accessors. */
export const GGML_BASE_SYMBOLS = {
  ggml_type_name: { parameters: ["i32"], result: P },
  ggml_type_size: { parameters: ["i32"], result: "usize" },
  ggml_blck_size: { parameters: ["i32"], result: "i64" },
  ggml_backend_dev_name: { parameters: [P], result: P },
  ggml_backend_dev_description: { parameters: [P], result: P },
  ggml_backend_dev_type: { parameters: [P], result: "i32" },
  ggml_backend_dev_backend_reg: { parameters: [P], result: P },
  ggml_backend_reg_name: { parameters: [P], result: P },
} as const satisfies Deno.ForeignLibraryInterface;

/** Each CPU backend variant plug-in exports a score: 0 = unsupported here, higher = better. */
export const GGML_CPU_VARIANT_SYMBOLS = {
  ggml_backend_score: { parameters: [], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;

/** Thread pools live in the CPU backend plug-in (`ggml-cpu.h`). */
export const GGML_CPU_SYMBOLS = {
  ggml_threadpool_new: { parameters: [BUF], result: P },
  ggml_threadpool_free: { parameters: [P], result: "void" },
} as const satisfies Deno.ForeignLibraryInterface;

/** `struct ggml_threadpool_params`: cpumask[GGML_MAX_N_THREADS], then four scalars, two bools. */
export const GGML_MAX_N_THREADS = 512;
export const ggml_threadpool_params = {
  size: GGML_MAX_N_THREADS + 16,
  offsets: { n_threads: 512, prio: 516, poll: 520, strict_cpu: 524, paused: 525 },
} as const;

export type LlamaSymbols = Deno.DynamicLibrary<typeof LLAMA_SYMBOLS>["symbols"];
export type GgmlBaseSymbols = Deno.DynamicLibrary<typeof GGML_BASE_SYMBOLS>["symbols"];
export type GgmlSymbols = Deno.DynamicLibrary<typeof GGML_SYMBOLS>["symbols"];
export type GgmlCpuSymbols = Deno.DynamicLibrary<typeof GGML_CPU_SYMBOLS>["symbols"];
