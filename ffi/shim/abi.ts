/**
 * TypeScript mirror of `skippy_shim.h`: the ABI version, memory kinds, result codes, page
 * format constants and fact indices. `abi_test.ts` checks every value here against the header,
 * so the two cannot drift apart unnoticed.
 */

/** Must equal `SKIPPY_SHIM_ABI_VERSION` in skippy_shim.h; checked when the shim is loaded. */
export const SKIPPY_SHIM_ABI_VERSION = 3;

/** Memory kinds (`SKIPPY_MEM_*`). */
export const SHIM_MEM = {
  NONE: 0,
  KV: 1,
  HYBRID: 2,
  ISWA: 3,
  RECURRENT: 4,
  UNSUPPORTED: 5,
} as const;

/** Cache selectors (`SKIPPY_CACHE_*`). */
export const SHIM_CACHE = { MAIN: 0, SWA: 1 } as const;

/** Result codes (`SKIPPY_OK`, `SKIPPY_E_*`). */
export const SHIM_RC = {
  OK: 0,
  E_ARG: -1,
  E_KIND: -2,
  E_CAPACITY: -3,
  E_FORMAT: -4,
  E_CHECKSUM: -5,
  E_MISMATCH: -6,
  E_TOO_SMALL: -7,
  E_OVERLAP: -8,
  E_OCCUPIED: -9,
  E_SOURCE: -10,
  E_NATIVE: -11,
  E_SELFTEST: -12,
} as const;

/** Page wire format (`SKIPPY_PAGE_*`). */
export const SHIM_PAGE = {
  MAGIC: 0x50564B53,
  VERSION: 1,
  HEADER_BYTES: 64,
  FLAG_PLACED: 1,
  FLAG_EXT: 2,
  FLAG_VTRANS: 4,
} as const;

/** Indices into the facts array (`SKIPPY_FACT_*`). */
export const SHIM_FACT = {
  KIND: 0,
  MAIN_COUNT: 1,
  MAIN_MIN: 2,
  MAIN_MAX: 3,
  SWA_COUNT: 4,
  SWA_MIN: 5,
  SWA_MAX: 6,
  RECR_MAX: 7,
  MAIN_SIZE: 8,
  SWA_SIZE: 9,
  V_TRANS: 10,
  N_LAYER: 11,
  LEN: 16,
} as const;

/** Layer-capture flags (`SKIPPY_CAPTURE_*`). */
export const SHIM_CAPTURE = { COPY: 1 } as const;

/** Indices into the capture info array (`SKIPPY_CAPINFO_*`). */
export const SHIM_CAPINFO = {
  LAYERS: 0,
  N_LAYER: 1,
  CONV_ROW: 2,
  SSM_ROW: 3,
  BYTES: 4,
  ASKED: 5,
  OBSERVED: 6,
  CONV_TYPE: 7,
  SSM_TYPE: 8,
  COPY_NS: 9,
  PAGE_LAYER: 10,
  LEN: 16,
} as const;

const P = "pointer" as const;
const BUF = "buffer" as const;

/** The shim's exported symbols. Large page copies also bind as `nonblocking` (`*_async`). */
export const SHIM_SYMBOLS = {
  skippy_shim_abi_version: { parameters: [], result: "u32" },
  skippy_shim_built_for: { parameters: [], result: P },
  skippy_shim_loaded_build_id: { parameters: [], result: P },
  skippy_memory_kind: { parameters: [P], result: "i32" },
  skippy_self_test: { parameters: [P, BUF, "u64"], result: "i32" },
  skippy_page_size: { parameters: [P, "i32", "i32", "i32", "i32", BUF, "u64"], result: "i64" },
  skippy_page_export: {
    parameters: [P, "i32", "i32", "i32", "i32", BUF, "u64", BUF, "u64"],
    result: "i64",
  },
  skippy_page_export_async: {
    name: "skippy_page_export",
    parameters: [P, "i32", "i32", "i32", "i32", BUF, "u64", BUF, "u64"],
    result: "i64",
    nonblocking: true,
  },
  skippy_page_import: { parameters: [P, "i32", "i32", BUF, "u64", BUF, "u64"], result: "i32" },
  skippy_page_import_async: {
    name: "skippy_page_import",
    parameters: [P, "i32", "i32", BUF, "u64", BUF, "u64"],
    result: "i32",
    nonblocking: true,
  },
  skippy_seq_facts: { parameters: [P, "i32", BUF, BUF, "u64"], result: "i32" },
  skippy_checksum_crc32c: { parameters: ["u32", BUF, "u64"], result: "u32" },
  skippy_recurrent_layout: { parameters: [P, "i32", BUF, "u64", BUF, "u64"], result: "i64" },
  skippy_recurrent_export_async: {
    name: "skippy_recurrent_export",
    parameters: [P, "i32", "u64", "u64", BUF, "u64", BUF, "u64"],
    result: "i64",
    nonblocking: true,
  },
  skippy_recurrent_import_async: {
    name: "skippy_recurrent_import",
    parameters: [P, "i32", "u64", BUF, "u64", BUF, "u64"],
    result: "i32",
    nonblocking: true,
  },
  skippy_capture_open: { parameters: [P, BUF, "u64"], result: P },
  skippy_capture_close: { parameters: [P], result: "void" },
  skippy_capture_arm: { parameters: [P, "i32", "i32", "u32", BUF, "u64"], result: "i32" },
  skippy_capture_arm_page: { parameters: [P, "i32", "i32", "u64", BUF, "u64"], result: "i32" },
  skippy_capture_page_state: { parameters: [P], result: "i64" },
  skippy_capture_page_error: { parameters: [P], result: P },
  skippy_capture_page: { parameters: [P], result: P },
  skippy_capture_page_ready_ns: { parameters: [P], result: "i64" },
  skippy_capture_disarm: { parameters: [P], result: "void" },
  skippy_capture_ready: { parameters: [P], result: "i32" },
  skippy_capture_error: { parameters: [P], result: P },
  skippy_capture_layer: { parameters: [P, "i32"], result: "i32" },
  skippy_capture_is_ready: { parameters: [P, "i32"], result: "i32" },
  skippy_capture_ready_ns: { parameters: [P, "i32"], result: "i64" },
  skippy_capture_now_ns: { parameters: [], result: "i64" },
  skippy_capture_entries: { parameters: [P], result: P },
  skippy_capture_info: { parameters: [P, BUF], result: "void" },
} as const satisfies Deno.ForeignLibraryInterface;

export type ShimSymbols = Deno.DynamicLibrary<typeof SHIM_SYMBOLS>["symbols"];
