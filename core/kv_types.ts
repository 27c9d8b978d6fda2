/**
 * The K/V cache element types a worker may run with, by `enum ggml_type` code. One table for
 * the binding (which passes the code to llama.cpp), the model maker (which sizes the state)
 * and the CLI (which offers them as choices).
 */
export const KV_CACHE_TYPES = {
  f32: 0,
  f16: 1,
  q4_0: 2,
  q4_1: 3,
  q5_0: 6,
  q5_1: 7,
  q8_0: 8,
  bf16: 30,
} as const;

export type KvType = keyof typeof KV_CACHE_TYPES;
