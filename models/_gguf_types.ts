/**
 * GGUF v3 constants shared by the writer and the reader: value type codes, ggml tensor type
 * codes and their block sizes. Numbers come from ggml's `gguf.cpp`, `ggml.h` and gguf-py's
 * `GGML_QUANT_SIZES`.
 */

/** "GGUF" read as a little-endian u32. */
export const GGUF_MAGIC = 0x46554747;
export const GGUF_VERSION = 3;
/** llama.cpp's default, and what every file this project writes uses. */
export const GGUF_DEFAULT_ALIGNMENT = 32;

/** GGUF metadata value type codes. */
export const GgufValueType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** Byte size of each fixed-size scalar value type (strings and arrays are variable). */
export const SCALAR_BYTES: Readonly<Record<number, number>> = {
  [GgufValueType.UINT8]: 1,
  [GgufValueType.INT8]: 1,
  [GgufValueType.UINT16]: 2,
  [GgufValueType.INT16]: 2,
  [GgufValueType.UINT32]: 4,
  [GgufValueType.INT32]: 4,
  [GgufValueType.FLOAT32]: 4,
  [GgufValueType.BOOL]: 1,
  [GgufValueType.UINT64]: 8,
  [GgufValueType.INT64]: 8,
  [GgufValueType.FLOAT64]: 8,
};

/** The ggml tensor types this project writes. */
export const GgmlType = { F32: 0, F16: 1 } as const;
export type WeightType = "f32" | "f16";

export const WEIGHT_TYPE_CODE: Readonly<Record<WeightType, number>> = {
  f32: GgmlType.F32,
  f16: GgmlType.F16,
};

/** ggml type code -> [name, elements per block, bytes per block], for every type GGUF may hold. */
const GGML_TYPES: Readonly<Record<number, readonly [string, number, number]>> = {
  0: ["F32", 1, 4],
  1: ["F16", 1, 2],
  2: ["Q4_0", 32, 18],
  3: ["Q4_1", 32, 20],
  6: ["Q5_0", 32, 22],
  7: ["Q5_1", 32, 24],
  8: ["Q8_0", 32, 34],
  9: ["Q8_1", 32, 40],
  10: ["Q2_K", 256, 84],
  11: ["Q3_K", 256, 110],
  12: ["Q4_K", 256, 144],
  13: ["Q5_K", 256, 176],
  14: ["Q6_K", 256, 210],
  15: ["Q8_K", 256, 292],
  16: ["IQ2_XXS", 256, 66],
  17: ["IQ2_XS", 256, 74],
  18: ["IQ3_XXS", 256, 98],
  19: ["IQ1_S", 256, 50],
  20: ["IQ4_NL", 32, 18],
  21: ["IQ3_S", 256, 110],
  22: ["IQ2_S", 256, 82],
  23: ["IQ4_XS", 256, 136],
  24: ["I8", 1, 1],
  25: ["I16", 1, 2],
  26: ["I32", 1, 4],
  27: ["I64", 1, 8],
  28: ["F64", 1, 8],
  29: ["IQ1_M", 256, 56],
  30: ["BF16", 1, 2],
  34: ["TQ1_0", 256, 54],
  35: ["TQ2_0", 256, 66],
  39: ["MXFP4", 32, 17],
  40: ["NVFP4", 64, 36],
  41: ["Q1_0", 128, 18],
  42: ["Q2_0", 64, 18],
};

/** Name of a ggml type code, or undefined for codes this table does not know. */
export function ggmlTypeName(code: number): string | undefined {
  return GGML_TYPES[code]?.[0];
}

/**
 * Bytes a tensor of `elements` elements takes in ggml type `code` (row-major, rows of `ne0`).
 * Returns undefined for an unknown type or a row length that is not a whole number of blocks.
 */
export function ggmlTensorBytes(code: number, ne0: number, elements: number): number | undefined {
  const entry = GGML_TYPES[code];
  if (entry === undefined) return undefined;
  const [, blockElements, blockBytes] = entry;
  if (ne0 % blockElements !== 0) return undefined;
  return (elements / blockElements) * blockBytes;
}

/** Rounds `n` up to a multiple of `alignment` (a power of two). */
export function alignUp(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}
