/**
 * The public-API fallback for page export and import, used when the native shim is not
 * available. Same page format as the shim path, so the two sides need not agree on which path
 * they use.
 *
 * - Export: `llama_state_seq_get_data` of the whole sequence, then the cells with positions in
 *   [p0, p1) are sliced out by their per-cell position. O(context) per page, so the total is
 *   quadratic in prompt length; fine for short prompts, measured in bench/state_bench.ts.
 * - Import: pages are staged in memory and assembled at the end into one full blob (pages in
 *   position order, then the recurrent or sliding-window section), imported with one
 *   `llama_state_seq_set_data`. llama.cpp then places cells from cell 0 in position order,
 *   which is the layout a prefill into an empty cache produces.
 */
import { StateValidationError } from "../core/errors.ts";
import type { LlamaContext } from "./context.ts";
import {
  buildPage,
  type PageHeader,
  pageMeta,
  parseRows,
  type RowBlock,
  type Rows,
} from "./_state_page.ts";
import type { MemoryKind } from "./shim/shim.ts";

const SEQ_MAGIC = 0xaf143cd8;
const CELL_META_BYTES = 12;

/** Memory kind as far as the public API can tell (model flags). */
export function publicMemoryKind(ctx: LlamaContext): MemoryKind {
  const s = ctx.model.lib.symbols;
  const m = ctx.model.ptr;
  if (s.llama_model_is_recurrent(m)) return "recurrent";
  const swa = s.llama_model_n_swa(m) > 0;
  if (s.llama_model_is_hybrid(m)) return swa ? "unsupported" : "hybrid";
  return swa ? "iswa" : "kv";
}

interface AttentionStream {
  count: number;
  positions: Int32Array;
  rows: Rows | null;
}

/** Parses the first attention section of a sequence blob (after magic and seq id). */
function parseAttention(blob: Uint8Array): { streams: AttentionStream[]; end: number } {
  const d = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
  const bad = () => new StateValidationError("Cannot read the sequence state: unexpected layout");
  if (blob.byteLength < 12 || d.getUint32(0, true) !== SEQ_MAGIC) throw bad();
  const nStream = d.getUint32(8, true);
  let at = 12;
  const streams: AttentionStream[] = [];
  for (let s = 0; s < nStream; s++) {
    const count = d.getUint32(at, true);
    at += 4;
    const positions = new Int32Array(count);
    for (let i = 0; i < count; i++, at += CELL_META_BYTES) {
      if (d.getUint32(at + 4, true) !== 1) throw bad();
      positions[i] = d.getInt32(at, true);
    }
    const rows = count > 0 ? parseRows(blob, at, count) : null;
    if (count > 0 && !rows) throw bad();
    at = rows ? rows.end : at;
    streams.push({ count, positions, rows });
  }
  return { streams, end: at };
}

/** Exports positions [p0, p1) of `seq` by slicing a full sequence export. */
export async function exportPagePublic(
  ctx: LlamaContext,
  seq: number,
  p0: number,
  p1: number,
): Promise<Uint8Array<ArrayBuffer>> {
  const blob = await ctx.stateSeqGet(seq, 0);
  const stream = parseAttention(blob).streams.find((s) => s.count > 0);
  const picks: number[] = [];
  if (stream) {
    for (let i = 0; i < stream.count; i++) {
      if (stream.positions[i] >= p0 && stream.positions[i] < p1) picks.push(i);
    }
    picks.sort((a, b) => stream.positions[a] - stream.positions[b]);
  }
  const positions = picks.map((i) => stream!.positions[i]);
  if (!stream?.rows || positions.length !== p1 - p0 || positions.some((p, i) => p !== p0 + i)) {
    throw new StateValidationError(
      `Cannot export kv-page tokens [${p0}, ${p1}): the attention cache holds ${positions.length} of those positions`,
      { hint: "export a page only after the prefill chunk that produced it has been decoded" },
    );
  }
  const kvSize = ctx.model.lib.symbols.llama_n_ctx_seq(ctx.ptr);
  return buildPage({
    cache: 0,
    seq,
    p0,
    p1,
    kvSize,
    picks,
    positions,
    rowsCount: stream.count,
    rows: stream.rows,
  });
}

/** A staged page for assembly: its header, metadata and rows. */
export interface StagedPage {
  header: PageHeader;
  page: Uint8Array;
  rows: Rows;
}

function concatBlocks(
  pages: readonly StagedPage[],
  pick: (r: Rows) => RowBlock[],
  out: Uint8Array,
  at: number,
) {
  const first = pick(pages[0].rows);
  for (let l = 0; l < first.length; l++) {
    out.set(first[l].head, at);
    at += 12;
    for (let s = 0; s < first[l].segments; s++) {
      for (const p of pages) {
        const b = pick(p.rows)[l];
        const seg = p.header.cellCount * b.unit;
        out.set(b.data.subarray(s * seg, (s + 1) * seg), at);
        at += seg;
      }
    }
  }
  return at;
}

/**
 * One full sequence blob from `pages` (sorted by position, layouts already checked equal) and
 * `tail` (the recurrent or sliding-window section, without magic and seq id).
 */
export function assembleSeqBlob(
  pages: readonly StagedPage[],
  seq: number,
  nStream: number,
  stream: number,
  tail: Uint8Array,
): Uint8Array<ArrayBuffer> {
  const cells = pages.reduce((n, p) => n + p.header.cellCount, 0);
  const blocks = (r: Rows) => [...r.k, ...r.v];
  const rowsBytes = pages.length === 0 ? 0 : 8 + blocks(pages[0].rows).length * 12 +
    pages.reduce((n, p) => n + blocks(p.rows).reduce((m, b) => m + b.data.byteLength, 0), 0);
  const size = 12 + nStream * 4 + cells * CELL_META_BYTES + rowsBytes + tail.byteLength;
  const blob = new Uint8Array(size);
  const d = new DataView(blob.buffer);
  d.setUint32(0, SEQ_MAGIC, true);
  d.setInt32(4, seq, true);
  d.setUint32(8, nStream, true);
  let at = 12;
  for (let s = 0; s < nStream; s++) {
    const count = s === stream ? cells : 0;
    d.setUint32(at, count, true);
    at += 4;
    if (count === 0) continue;
    for (const p of pages) {
      blob.set(pageMeta(p.page, p.header), at);
      at += p.header.metaBytes;
    }
    d.setUint32(at, pages[0].rows.vTrans ? 1 : 0, true);
    d.setUint32(at + 4, pages[0].rows.k.length, true);
    at = concatBlocks(pages, (r) => r.k, blob, at + 8);
    at = concatBlocks(pages, (r) => r.v, blob, at);
  }
  blob.set(tail, at);
  at += tail.byteLength;
  if (at !== size) throw new Error(`Internal error: assembled ${at} of ${size} bytes`);
  return blob;
}
