/**
 * The native state shim: page-granular KV export and append-import below llama.cpp's public
 * API (see README.md). Product code uses it through `../state.ts` and `../staged_import.ts`.
 */
export {
  type CacheName,
  checkIdentity,
  loadShim,
  type MemoryKind,
  PAGE_ASYNC_BYTES_MIN,
  type SeqFacts,
  Shim,
  ShimCallError,
  type ShimStatus,
} from "./shim.ts";
export {
  buildShim,
  defaultCacheDir,
  defaultTarget,
  FAILED_RETRY_MS,
  SHIM_SOURCES,
  type ShimBuildOptions,
  type ShimBuildTarget,
  shimPath,
} from "./build.ts";
export {
  SHIM_CACHE,
  SHIM_FACT,
  SHIM_MEM,
  SHIM_PAGE,
  SHIM_RC,
  SKIPPY_SHIM_ABI_VERSION,
} from "./abi.ts";
