/**
 * Export primitives for a request's continuation state, on the prefill side, and the choice of
 * path that both sides make per context:
 *
 * - `shim`: the native shim (./shim/) exports attention KV pages in O(page) straight from the
 *   cache and appends them on the decoder at their source cell indices.
 * - `public`: llama.cpp's public state API only (./_state_public.ts), chosen automatically
 *   with a one-line reason when the shim cannot be built, loaded or trusted for a context.
 *
 * Ownership: every export returns a buffer the caller owns (a fresh one, or a view of the
 * caller's own `into` buffer); nothing here keeps a reference. The decoder side is
 * `StagedImport` (./staged_import.ts).
 */
import {
  assert,
  IdentityMismatchError,
  LimitExceededError,
  RuntimeLibraryError,
  StateValidationError,
} from "../core/errors.ts";
import { DEFAULT_STATE_BOUNDS } from "../core/schema.ts";
import { sayOnce } from "../core/say_once.ts";
import type { LlamaContext } from "./context.ts";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "./llama.ts";
import { type EntrySpan, type RecurrentSnapshot, splitRecurrent } from "./_recurrent_split.ts";
import { exportPagePublic, publicMemoryKind } from "./_state_public.ts";
import {
  type CacheName,
  loadShim,
  type MemoryKind,
  type Shim,
  ShimCallError,
} from "./shim/shim.ts";
import { SHIM_PAGE, SHIM_RC } from "./shim/abi.ts";
import { pageRows, readPageHeader } from "./_state_page.ts";

export type { RecurrentSnapshot } from "./_recurrent_split.ts";
export {
  countEntries,
  type EntrySpan,
  entrySpans,
  joinRecurrent,
  snapshotPosition,
  splitRecurrent,
} from "./_recurrent_split.ts";
export type { MemoryKind } from "./shim/shim.ts";

/** How state moves through a context. */
export type StatePath = "shim" | "public";

export interface StateBackend {
  path: StatePath;
  kind: MemoryKind;
  /** Why the public path was chosen (one line), or null on the shim path. */
  reason: string | null;
  shim: Shim | null;
}

export interface StateOptions {
  /** Sequence id (default 0). */
  seq?: number;
  /** `auto` (default) uses the shim when it can; `public` forces the fallback. */
  path?: "auto" | "public";
  /** Largest page this call may produce (default: the schema's chunk payload bound). */
  pageBytesMax?: number;
  /**
   * Shim path: a buffer to write the page into when it is large enough (the result is then a
   * view of it), so a prefill loop can recycle a bounded pool of page buffers.
   */
  into?: Uint8Array<ArrayBuffer>;
}

/** Picks the path for `ctx` (loading, building and self-testing the shim on first use). */
export async function stateBackend(
  ctx: LlamaContext,
  want: "auto" | "public" = "auto",
): Promise<StateBackend> {
  const fallback = (reason: string, quiet = false): StateBackend => {
    if (!quiet) sayOnce(`state moves through the public llama.cpp API: ${reason}`);
    return { path: "public", kind: publicMemoryKind(ctx), reason, shim: null };
  };
  if (want === "public") return fallback("requested", true);
  const status = await loadShim(ctx.model.lib);
  if (!status.ok) return fallback(`native shim unavailable (${status.reason})`);
  const kind = status.shim.memoryKind(ctx);
  if (kind === "unsupported" || kind === "none") {
    return fallback(`the native shim does not handle this context's memory type (${kind})`);
  }
  const selfTest = status.shim.selfTest(ctx);
  if (selfTest !== null) return fallback(`native shim self-test failed (${selfTest})`);
  return { path: "shim", kind, reason: null, shim: status.shim };
}

/** Turns a failed shim call into the typed error for `what` (a component and range). */
export function shimFailure(error: unknown, verb: string, what: string): Error {
  if (!(error instanceof ShimCallError)) return error as Error;
  if (error.code === SHIM_RC.E_CAPACITY) {
    return new LimitExceededError(`Cannot ${verb} ${what}: ${error.message}`, {
      hint: "use smaller prefill chunks (pages), or raise pageBytesMax",
    });
  }
  if (error.code === SHIM_RC.E_NATIVE || error.code === SHIM_RC.E_SELFTEST) {
    return new RuntimeLibraryError(`Cannot ${verb} ${what}: ${error.message}`);
  }
  if (error.code === SHIM_RC.E_TOO_SMALL || error.code === SHIM_RC.E_MISMATCH) {
    return new IdentityMismatchError(`Cannot ${verb} ${what}: ${error.message}`, {
      hint: "both sides need the same numerical identity (n_ctx, K/V types, flash attention)",
    });
  }
  const hint = error.code === SHIM_RC.E_SOURCE
    ? "export a page only after the prefill chunk that produced it has been decoded"
    : undefined;
  return new StateValidationError(`Cannot ${verb} ${what}: ${error.message}`, { hint });
}

function checkRange(p0: number, p1: number, what: string): void {
  if (!Number.isInteger(p0) || !Number.isInteger(p1) || p0 < 0 || p1 <= p0 || p1 > 2 ** 31 - 1) {
    throw new StateValidationError(`Cannot export ${what}: invalid token range`);
  }
}

function boundPage(page: Uint8Array, what: string, max: number): Uint8Array<ArrayBuffer> {
  if (page.byteLength > max) {
    throw new LimitExceededError(
      `Cannot export ${what}: ${page.byteLength} bytes exceeds the page bound of ${max}`,
      { hint: "use smaller prefill chunks (pages), or raise pageBytesMax" },
    );
  }
  return page as Uint8Array<ArrayBuffer>;
}

async function exportCachePage(
  ctx: LlamaContext,
  cache: CacheName,
  p0: number,
  p1: number,
  what: string,
  options: StateOptions,
): Promise<Uint8Array<ArrayBuffer>> {
  const seq = options.seq ?? 0;
  const max = options.pageBytesMax ?? DEFAULT_STATE_BOUNDS.chunkPayloadBytesMax;
  const backend = await stateBackend(ctx, options.path);
  if (backend.shim) {
    const shim = backend.shim;
    try {
      // Queued behind the decode that produced the rows (a context is not re-entrant).
      return await ctx.serialize(() => shim.exportPage(ctx, cache, seq, p0, p1, max, options.into));
    } catch (error) {
      throw shimFailure(error, "export", what);
    }
  }
  assert(cache === "main", "sliding-window pages need the shim");
  return boundPage(await exportPagePublic(ctx, seq, p0, p1), what, max);
}

/**
 * Exports the attention KV of positions [p0, p1) as one page. Call it right after the prefill
 * chunk that produced them; the page can travel while the next chunk computes.
 *
 * @example
 * ```ts
 * await ctx.decode(batch); // positions [p0, p1)
 * const page = await exportKvPage(ctx, p0, p1);
 * ```
 */
export function exportKvPage(
  ctx: LlamaContext,
  p0: number,
  p1: number,
  options: StateOptions = {},
): Promise<Uint8Array<ArrayBuffer>> {
  const what = `kv-page tokens [${p0}, ${p1})`;
  checkRange(p0, p1, what);
  return exportCachePage(ctx, "main", p0, p1, what, options);
}

/**
 * The recurrent snapshot (conv + SSM of every recurrent layer) after the last prefill chunk,
 * split into its conv and SSM parts when the layout is the known one (see RecurrentSnapshot).
 */
export async function exportRecurrent(
  ctx: LlamaContext,
  options: StateOptions = {},
): Promise<RecurrentSnapshot> {
  const kind = (await stateBackend(ctx, options.path)).kind;
  if (kind !== "hybrid" && kind !== "recurrent") {
    throw new StateValidationError(
      `Cannot export conv/ssm: this context has no recurrent state (${kind})`,
    );
  }
  const blob = await ctx.stateSeqGet(options.seq ?? 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
  return splitRecurrent(blob);
}

/** A recurrent snapshot's layout in blob offsets: one entry span per recurrent layer. */
export interface RecurrentLayout {
  /** Bytes of the whole snapshot blob. */
  bytes: number;
  /** Conv entries in layer order; the header is `[0, conv[0].start)`. */
  conv: EntrySpan[];
  /** SSM entries in layer order, right after the last conv entry. */
  ssm: EntrySpan[];
}

/** Bytes of an entry's preamble: i32 type and u64 row size before its rows. */
const ENTRY_PREAMBLE_BYTES = 12;

/**
 * The layout of `seq`'s recurrent snapshot in `ctx` through the shim, or null when windows
 * are not available (public path, or a layout this code does not know, such as extra
 * per-layer rows): callers then export the snapshot whole.
 */
export async function recurrentLayout(
  ctx: LlamaContext,
  seq = 0,
): Promise<RecurrentLayout | null> {
  const backend = await stateBackend(ctx);
  if (!backend.shim || (backend.kind !== "hybrid" && backend.kind !== "recurrent")) return null;
  let raw: { bytes: number; rows: { offset: number; size: number }[] };
  try {
    raw = backend.shim.recurrentLayout(ctx, seq);
  } catch {
    return null;
  }
  const half = raw.rows.length / 2;
  if (raw.rows.length === 0 || !Number.isInteger(half)) return null;
  const spans = raw.rows.map((r) => ({
    start: r.offset - ENTRY_PREAMBLE_BYTES,
    end: r.offset + r.size,
  }));
  const contiguous = spans.every((sp, i) => i === 0 || sp.start === spans[i - 1].end);
  if (!contiguous || spans[spans.length - 1].end !== raw.bytes) return null;
  return { bytes: raw.bytes, conv: spans.slice(0, half), ssm: spans.slice(half) };
}

/** Bytes [from, to) of `seq`'s recurrent snapshot (shim path; see `recurrentLayout`). */
export async function exportRecurrentWindow(
  ctx: LlamaContext,
  from: number,
  to: number,
  seq = 0,
): Promise<Uint8Array<ArrayBuffer>> {
  const backend = await stateBackend(ctx);
  assert(backend.shim !== null, "recurrent windows need the native shim");
  const shim = backend.shim;
  try {
    return await ctx.serialize(() => shim.exportRecurrentWindow(ctx, seq, from, to));
  } catch (error) {
    throw shimFailure(error, "export", `conv/ssm bytes [${from}, ${to})`);
  }
}

/**
 * The sliding-window cache of an ISWA context after the last prefill chunk, as one placed page
 * holding every cell of the sequence in that cache (masked ones too: the decoder needs the
 * same cell occupancy to place later tokens where the prefiller would). Bounded by the window
 * ring with `swaFull: false`; the whole context with llama.cpp's default full-size cache.
 * Needs the native shim.
 */
export async function exportSwa(
  ctx: LlamaContext,
  options: StateOptions = {},
): Promise<Uint8Array<ArrayBuffer>> {
  const backend = await stateBackend(ctx, options.path);
  if (backend.kind !== "iswa") {
    throw new StateValidationError(
      `Cannot export swa-kv: this context has no sliding-window cache (${backend.kind})`,
    );
  }
  if (backend.path !== "shim") {
    // llama.cpp's own export leaves out the masked cells of the window, which changes where
    // later tokens land: measured, continuations diverge within a few tokens.
    throw new StateValidationError(
      `Cannot export swa-kv exactly without the native shim (${backend.reason})`,
      { hint: "build the shim (`deno run -A ffi/shim/build.ts`), or prefill on the decoder" },
    );
  }
  try {
    return await exportCachePage(ctx, "swa", 0, 2 ** 31 - 1, "swa-kv", options);
  } catch (error) {
    if (!(error instanceof LimitExceededError)) throw error;
    throw new LimitExceededError(error.message, {
      hint: "create the contexts with swaFull: false (a ring window cache) to bound it",
    });
  }
}

/**
 * The pending MTP hidden row: the target's nextn embedding of output row `row` after its last
 * prefill decode (n_embd little-endian f32). The draft context's own KV travels as pages of
 * the draft context: `exportKvPage(draft, p0, p1)`.
 */
export function exportMtpHidden(target: LlamaContext, row: number): Uint8Array<ArrayBuffer> {
  const h = target.nextnEmbedding(row); // a fresh copy
  return new Uint8Array(h.buffer as ArrayBuffer, h.byteOffset, h.byteLength);
}

/** What a page holds, for reports: its range, K/V row bytes and everything else. */
export interface PageSummary {
  p0: number;
  p1: number;
  cells: number;
  /** Bytes of K/V rows (the attention state itself). */
  rowBytes: number;
  /** Header, cell ranges, cell metadata and per-layer row headers. */
  metaBytes: number;
  /** True when the page carries source cell indices (made by the shim). */
  placed: boolean;
}

/** Summarizes a page made by `exportKvPage` or `exportSwa` (never its content). */
export function summarizePage(page: Uint8Array): PageSummary {
  const h = readPageHeader(page, "page");
  const rows = pageRows(page, h, "page");
  const rowBytes = [...rows.k, ...rows.v].reduce((n, b) => n + b.data.byteLength, 0);
  return {
    p0: h.p0,
    p1: h.p1,
    cells: h.cellCount,
    rowBytes,
    metaBytes: page.byteLength - rowBytes,
    placed: (h.flags & SHIM_PAGE.FLAG_PLACED) !== 0,
  };
}
