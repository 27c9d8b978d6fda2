/**
 * Loads the native shim and wraps its calls. Loading never throws: it returns either a `Shim`
 * or the one-line reason it cannot be used (no compiler, no network for the headers, another
 * library build, ABI or build-id mismatch), and callers fall back to the public state API.
 *
 * Trust is checked in layers: the shim's ABI version equals `SKIPPY_SHIM_ABI_VERSION`; the
 * build id baked in at compile time equals the loaded library's (read by the shim itself from
 * the mapped image); and `selfTest(ctx)` runs once per context before the first page call.
 */
import type { LlamaLibrary } from "../library.ts";
import type { LlamaContext } from "../context.ts";
import { buildShim, type ShimBuildOptions } from "./build.ts";
import { SHIM_FACT, SHIM_MEM, SHIM_RC, SHIM_SYMBOLS, SKIPPY_SHIM_ABI_VERSION } from "./abi.ts";
import type { ShimSymbols } from "./abi.ts";
import { installCrc32cAccelerator } from "../../core/crc32c.ts";

/** Exact memory type of a context (see `SKIPPY_MEM_*`). */
export type MemoryKind = "none" | "kv" | "hybrid" | "iswa" | "recurrent" | "unsupported";
const KINDS: Record<number, MemoryKind> = {
  [SHIM_MEM.NONE]: "none",
  [SHIM_MEM.KV]: "kv",
  [SHIM_MEM.HYBRID]: "hybrid",
  [SHIM_MEM.ISWA]: "iswa",
  [SHIM_MEM.RECURRENT]: "recurrent",
};

/** Which attention cache a page addresses. */
export type CacheName = "main" | "swa";
const CACHE_ID: Record<CacheName, number> = { main: 0, swa: 1 };

/** Positions one sequence holds in each part of a context's memory (-1 = none). */
export interface SeqFacts {
  kind: MemoryKind;
  main: { count: number; min: number; max: number; size: number };
  swa: { count: number; min: number; max: number; size: number };
  recurrentPos: number;
  vTrans: boolean;
  nLayer: number;
}

/** A failed shim call: `code` is a `SHIM_RC` value, `message` the shim's one line. */
export class ShimCallError extends Error {
  constructor(readonly code: number, message: string) {
    super(message);
  }
}

/** Most row regions a recurrent snapshot may have (two per recurrent layer). */
const RECURRENT_REGIONS_MAX = 8192;

/** Pages at least this large are copied off the event loop (nonblocking calls). */
export const PAGE_ASYNC_BYTES_MIN = 1 << 20;
const ERR_BYTES = 512;

export class Shim {
  #tested = new WeakMap<LlamaContext, string | null>();

  constructor(readonly symbols: ShimSymbols, readonly path: string) {}

  memoryKind(ctx: LlamaContext): MemoryKind {
    return KINDS[this.symbols.skippy_memory_kind(ctx.ptr)] ?? "unsupported";
  }

  /** Null when the shim's view of `ctx` agrees with libllama's, else the difference. Cached. */
  selfTest(ctx: LlamaContext): string | null {
    if (this.#tested.has(ctx)) return this.#tested.get(ctx)!;
    const err = new Uint8Array(ERR_BYTES);
    const rc = this.symbols.skippy_self_test(ctx.ptr, err, BigInt(ERR_BYTES));
    const result = rc === SHIM_RC.OK ? null : cText(err);
    this.#tested.set(ctx, result);
    return result;
  }

  /**
   * Exports positions [p0, p1) of `seq` from `cache` as one page (see skippy_shim.h), into
   * `into` when it is large enough (the result is then a view of it), else a fresh buffer.
   */
  async exportPage(
    ctx: LlamaContext,
    cache: CacheName,
    seq: number,
    p0: number,
    p1: number,
    bytesMax = Number.MAX_SAFE_INTEGER,
    into?: Uint8Array<ArrayBuffer>,
  ): Promise<Uint8Array<ArrayBuffer>> {
    const s = this.symbols;
    const err = new Uint8Array(ERR_BYTES);
    const size = Number(s.skippy_page_size(ctx.ptr, CACHE_ID[cache], seq, p0, p1, err, 512n));
    if (size < 0) throw new ShimCallError(size, cText(err));
    if (size > bytesMax) {
      throw new ShimCallError(
        SHIM_RC.E_CAPACITY,
        `the page needs ${size} bytes, over the bound of ${bytesMax}`,
      );
    }
    const page = into && into.byteLength >= size ? into.subarray(0, size) : new Uint8Array(size);
    const args = [ctx.ptr, CACHE_ID[cache], seq, p0, p1, page, BigInt(size), err, 512n] as const;
    const n = Number(
      size >= PAGE_ASYNC_BYTES_MIN
        ? await s.skippy_page_export_async(...args)
        : s.skippy_page_export(...args),
    );
    if (n < 0) throw new ShimCallError(n, cText(err));
    if (n !== size) throw new ShimCallError(SHIM_RC.E_NATIVE, `page wrote ${n} of ${size} bytes`);
    return page;
  }

  /** Appends a page to `seq` of `cache`; throws ShimCallError, leaving the cache unchanged. */
  async importPage(ctx: LlamaContext, cache: CacheName, seq: number, page: Uint8Array) {
    const s = this.symbols;
    const err = new Uint8Array(ERR_BYTES);
    const bytes = page as Uint8Array<ArrayBuffer>;
    const args = [
      ctx.ptr,
      CACHE_ID[cache],
      seq,
      bytes,
      BigInt(page.byteLength),
      err,
      512n,
    ] as const;
    const rc = page.byteLength >= PAGE_ASYNC_BYTES_MIN
      ? await s.skippy_page_import_async(...args)
      : s.skippy_page_import(...args);
    if (rc !== SHIM_RC.OK) throw new ShimCallError(rc, cText(err));
  }

  /**
   * The recurrent snapshot of `seq` (the PARTIAL_ONLY blob): its total bytes and its row
   * regions in blob order (conv rows of each recurrent layer, then SSM rows).
   */
  recurrentLayout(
    ctx: LlamaContext,
    seq: number,
  ): { bytes: number; rows: { offset: number; size: number }[] } {
    const err = new Uint8Array(ERR_BYTES);
    const out = new BigUint64Array(2 + 2 * RECURRENT_REGIONS_MAX);
    const n = Number(
      this.symbols.skippy_recurrent_layout(ctx.ptr, seq, out, BigInt(out.length), err, 512n),
    );
    if (n < 0) throw new ShimCallError(n, cText(err));
    const rows = Array.from({ length: n }, (_, i) => ({
      offset: Number(out[2 + 2 * i]),
      size: Number(out[3 + 2 * i]),
    }));
    return { bytes: Number(out[0]), rows };
  }

  /** Bytes [from, to) of `seq`'s recurrent snapshot, into `into` (or a fresh buffer). */
  async exportRecurrentWindow(
    ctx: LlamaContext,
    seq: number,
    from: number,
    to: number,
    into?: Uint8Array<ArrayBuffer>,
  ): Promise<Uint8Array<ArrayBuffer>> {
    const err = new Uint8Array(ERR_BYTES);
    const size = to - from;
    const buf = into && into.byteLength >= size ? into.subarray(0, size) : new Uint8Array(size);
    const n = Number(
      await this.symbols.skippy_recurrent_export_async(
        ctx.ptr,
        seq,
        BigInt(from),
        BigInt(to),
        buf,
        BigInt(size),
        err,
        512n,
      ),
    );
    if (n < 0) throw new ShimCallError(n, cText(err));
    return buf;
  }

  /** Imports bytes [from, from + window.length) of a source's snapshot into `seq`. */
  async importRecurrentWindow(
    ctx: LlamaContext,
    seq: number,
    from: number,
    window: Uint8Array,
  ): Promise<void> {
    const err = new Uint8Array(ERR_BYTES);
    const rc = await this.symbols.skippy_recurrent_import_async(
      ctx.ptr,
      seq,
      BigInt(from),
      window as Uint8Array<ArrayBuffer>,
      BigInt(window.byteLength),
      err,
      512n,
    );
    if (rc !== SHIM_RC.OK) throw new ShimCallError(rc, cText(err));
  }

  facts(ctx: LlamaContext, seq: number): SeqFacts {
    const out = new Int32Array(SHIM_FACT.LEN);
    const err = new Uint8Array(ERR_BYTES);
    const rc = this.symbols.skippy_seq_facts(ctx.ptr, seq, out, err, 512n);
    if (rc !== SHIM_RC.OK) throw new ShimCallError(rc, cText(err));
    const F = SHIM_FACT;
    return {
      kind: KINDS[out[F.KIND]] ?? "unsupported",
      main: {
        count: out[F.MAIN_COUNT],
        min: out[F.MAIN_MIN],
        max: out[F.MAIN_MAX],
        size: out[F.MAIN_SIZE],
      },
      swa: {
        count: out[F.SWA_COUNT],
        min: out[F.SWA_MIN],
        max: out[F.SWA_MAX],
        size: out[F.SWA_SIZE],
      },
      recurrentPos: out[F.RECR_MAX],
      vTrans: out[F.V_TRANS] === 1,
      nLayer: out[F.N_LAYER],
    };
  }
}

function cText(buf: Uint8Array): string {
  const end = buf.indexOf(0);
  return new TextDecoder().decode(buf.subarray(0, end < 0 ? buf.length : end)) || "no reason given";
}

/** Either a usable shim or why not (one line). */
export type ShimStatus = { ok: true; shim: Shim } | { ok: false; reason: string };

let pending: Promise<ShimStatus> | null = null;

/**
 * The shim for `lib`, built on first use when the cache has none. Memoized per process.
 * `SKIPPY_SHIM=off` disables it.
 */
export function loadShim(lib: LlamaLibrary, options: ShimBuildOptions = {}): Promise<ShimStatus> {
  pending ??= openShim(lib, options);
  return pending;
}

async function openShim(lib: LlamaLibrary, options: ShimBuildOptions): Promise<ShimStatus> {
  if (Deno.env.get("SKIPPY_SHIM") === "off") {
    return { ok: false, reason: "disabled by SKIPPY_SHIM=off" };
  }
  let path: string;
  try {
    path = await buildShim({
      libDir: lib.libDir,
      llamaFile: lib.platform.llamaFile,
      ggmlBaseFile: lib.platform.ggmlBaseFile,
      buildId: lib.buildId,
    }, options);
  } catch (error) {
    return {
      ok: false,
      reason: `cannot build it: ${error instanceof Error ? error.message : error}`,
    };
  }
  let handle: Deno.DynamicLibrary<typeof SHIM_SYMBOLS>;
  try {
    handle = Deno.dlopen(path, SHIM_SYMBOLS);
  } catch (error) {
    return {
      ok: false,
      reason: `cannot open ${path}: ${error instanceof Error ? error.message : error}`,
    };
  }
  const reason = checkIdentity(handle.symbols, lib.buildId);
  if (reason) {
    handle.close();
    return { ok: false, reason };
  }
  const symbols = handle.symbols;
  installCrc32cAccelerator((bytes, crc) =>
    symbols.skippy_checksum_crc32c(crc, bytes as Uint8Array<ArrayBuffer>, BigInt(bytes.length))
  );
  return { ok: true, shim: new Shim(symbols, path) };
}

/** Null when the shim `s` was built for, and sees, the libllama of `buildId`; else why not. */
export function checkIdentity(s: ShimSymbols, buildId: string): string | null {
  const abi = s.skippy_shim_abi_version();
  if (abi !== SKIPPY_SHIM_ABI_VERSION) {
    return `ABI version ${abi}, this code expects ${SKIPPY_SHIM_ABI_VERSION}`;
  }
  const builtFor = readC(s.skippy_shim_built_for());
  if (builtFor !== buildId) return `built for libllama ${builtFor}, loaded is ${buildId}`;
  const seen = readC(s.skippy_shim_loaded_build_id());
  if (seen !== buildId) {
    return `the libllama the shim sees is "${seen || "unknown"}", expected ${buildId}`;
  }
  return null;
}

function readC(ptr: Deno.PointerValue): string {
  return ptr === null ? "" : new Deno.UnsafePointerView(ptr).getCString();
}
