/**
 * The KV page wire format in TypeScript (the shim writes and reads the same bytes natively; see
 * `shim/skippy_shim.h`): header parsing, checksum, and llama.cpp's K/V row section split into
 * per-layer blocks so pages can be checked, sliced and concatenated without the shim.
 *
 * Page = 64-byte header | source cell ranges | cell metadata | K/V rows. The rows section is
 * exactly llama.cpp's `state_write_data` layout for the page's cells.
 */
import { StateValidationError } from "../core/errors.ts";
import { crc32c } from "../core/crc32c.ts";
import { SHIM_PAGE } from "./shim/abi.ts";

export interface PageHeader {
  flags: number;
  /** 0 = main attention cache, 1 = sliding-window cache. */
  cache: number;
  seq: number;
  p0: number;
  p1: number;
  cellCount: number;
  nRanges: number;
  nLayer: number;
  /** Cells per stream of the source cache (its n_ctx). */
  kvSize: number;
  metaBytes: number;
  dataBytes: number;
  crc: number;
}

/**
 * One layer's K or V rows: `segments` runs (1, or n_embd_v for transposed V), each holding
 * `unit` bytes per cell for every cell in order. `head` is llama.cpp's per-layer header.
 */
export interface RowBlock {
  type: number;
  head: Uint8Array;
  unit: number;
  segments: number;
  data: Uint8Array;
}

export interface Rows {
  vTrans: boolean;
  k: RowBlock[];
  v: RowBlock[];
  /** Offset just past the rows. */
  end: number;
}

const H = SHIM_PAGE.HEADER_BYTES;
const CELL_META_BYTES = 12;

/** Reads and sanity-checks the header; `what` names the component in messages. */
export function readPageHeader(page: Uint8Array, what: string): PageHeader {
  const refuse = (detail: string) =>
    new StateValidationError(`Cannot stage ${what}: ${detail}`, {
      hint: "the page is not a KV page of this state schema; check the sender",
    });
  if (page.byteLength < H) throw refuse(`${page.byteLength} bytes is shorter than a page header`);
  const d = new DataView(page.buffer, page.byteOffset, page.byteLength);
  if (d.getUint32(0, true) !== SHIM_PAGE.MAGIC || d.getUint16(6, true) !== H) {
    throw refuse("bad magic");
  }
  if (d.getUint16(4, true) !== SHIM_PAGE.VERSION) {
    throw refuse(`page format version ${d.getUint16(4, true)}, expected ${SHIM_PAGE.VERSION}`);
  }
  const h: PageHeader = {
    flags: d.getUint32(8, true),
    cache: d.getUint32(12, true),
    seq: d.getInt32(16, true),
    p0: d.getInt32(20, true),
    p1: d.getInt32(24, true),
    cellCount: d.getUint32(28, true),
    nRanges: d.getUint32(32, true),
    nLayer: d.getUint32(36, true),
    kvSize: d.getUint32(40, true),
    metaBytes: d.getUint32(44, true),
    dataBytes: Number(d.getBigUint64(48, true)),
    crc: d.getUint32(56, true),
  };
  const body = h.nRanges * 8 + h.metaBytes + h.dataBytes;
  if (body !== page.byteLength - H) throw refuse("length does not match the header");
  if (h.p0 < 0 || h.p1 <= h.p0 || h.cellCount === 0 || h.cellCount > h.p1 - h.p0) {
    throw refuse(`range [${h.p0}, ${h.p1}) with ${h.cellCount} cells is invalid`);
  }
  return h;
}

/** The checksum a page header should carry. */
export function pageCrc(page: Uint8Array): number {
  return crc32c(page.subarray(H), crc32c(page.subarray(0, 56)));
}

/**
 * Splits llama.cpp's K/V rows section for `count` cells starting at `off`.
 * Returns null when the bytes do not parse as that layout.
 */
export function parseRows(bytes: Uint8Array, off: number, count: number): Rows | null {
  const d = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (off + 8 > bytes.byteLength) return null;
  const vTrans = d.getUint32(off, true) === 1;
  const nLayer = d.getUint32(off + 4, true);
  let at = off + 8;
  const block = (trans: boolean): RowBlock | null => {
    if (at + 12 > bytes.byteLength) return null;
    const type = d.getInt32(at, true);
    const unit = trans ? d.getUint32(at + 4, true) : Number(d.getBigUint64(at + 4, true));
    const segments = trans ? d.getUint32(at + 8, true) : 1;
    const size = unit * segments * count;
    if (type < 0 || type > 64 || unit === 0 || at + 12 + size > bytes.byteLength) return null;
    const b = { type, head: bytes.subarray(at, at + 12), unit, segments };
    const data = bytes.subarray(at + 12, at + 12 + size);
    at += 12 + size;
    return { ...b, data };
  };
  const k: RowBlock[] = [];
  const v: RowBlock[] = [];
  for (let i = 0; i < nLayer; i++) {
    const b = block(false);
    if (!b) return null;
    k.push(b);
  }
  for (let i = 0; i < nLayer; i++) {
    const b = block(vTrans);
    if (!b) return null;
    v.push(b);
  }
  return { vTrans, k, v, end: at };
}

/** The rows section of a page (throws when malformed). */
export function pageRows(page: Uint8Array, h: PageHeader, what: string): Rows {
  const off = H + h.nRanges * 8 + h.metaBytes;
  const rows = parseRows(page, off, h.cellCount);
  if (!rows || rows.end !== page.byteLength) {
    throw new StateValidationError(`Cannot stage ${what}: the K/V rows do not parse`);
  }
  return rows;
}

/** Cell metadata of a page: one {pos, n_seq_id, seq_id} entry per cell (no extended cells). */
export function pageMeta(page: Uint8Array, h: PageHeader): Uint8Array {
  const off = H + h.nRanges * 8;
  return page.subarray(off, off + h.metaBytes);
}

/** Runs of consecutive cell indices in `picks`, as [first, count] pairs. */
function runsOf(picks: readonly number[]): [number, number][] {
  const runs: [number, number][] = [];
  for (const i of picks) {
    const last = runs.at(-1);
    if (last && last[0] + last[1] === i) last[1]++;
    else runs.push([i, 1]);
  }
  return runs;
}

/** The picked cells' slices of every segment of `b`, appended to `out` at `at`. */
function copyCells(
  b: RowBlock,
  count: number,
  runs: readonly [number, number][],
  out: Uint8Array,
  at: number,
) {
  for (let s = 0; s < b.segments; s++) {
    const base = s * count * b.unit;
    for (const [first, n] of runs) {
      out.set(b.data.subarray(base + first * b.unit, base + (first + n) * b.unit), at);
      at += n * b.unit;
    }
  }
  return at;
}

export interface PageParts {
  cache: number;
  seq: number;
  p0: number;
  p1: number;
  kvSize: number;
  /** Source cells (indices into `rows`) in position order, with their positions. */
  picks: readonly number[];
  positions: readonly number[];
  /** Cell count of the blocks in `rows`. */
  rowsCount: number;
  rows: Rows;
}

/** Builds a page without cell placement (the importer puts position p in cell p). */
export function buildPage(parts: PageParts): Uint8Array<ArrayBuffer> {
  const n = parts.picks.length;
  const blocks = [...parts.rows.k, ...parts.rows.v];
  const dataBytes = 8 + blocks.reduce((sum, b) => sum + 12 + b.unit * b.segments * n, 0);
  const metaBytes = n * CELL_META_BYTES;
  const page = new Uint8Array(H + metaBytes + dataBytes);
  const d = new DataView(page.buffer);
  const fields: [number, number][] = [[0, SHIM_PAGE.MAGIC], [
    8,
    parts.rows.vTrans ? SHIM_PAGE.FLAG_VTRANS : 0,
  ]];
  fields.push([12, parts.cache], [28, n], [32, 0], [36, parts.rows.k.length], [40, parts.kvSize]);
  fields.push([44, metaBytes]);
  for (const [o, v] of fields) d.setUint32(o, v, true);
  d.setUint16(4, SHIM_PAGE.VERSION, true);
  d.setUint16(6, H, true);
  d.setInt32(16, parts.seq, true);
  d.setInt32(20, parts.p0, true);
  d.setInt32(24, parts.p1, true);
  d.setBigUint64(48, BigInt(dataBytes), true);
  let at: number = H;
  for (const pos of parts.positions) {
    d.setInt32(at, pos, true);
    d.setUint32(at + 4, 1, true);
    d.setInt32(at + 8, parts.seq, true);
    at += CELL_META_BYTES;
  }
  d.setUint32(at, parts.rows.vTrans ? 1 : 0, true);
  d.setUint32(at + 4, parts.rows.k.length, true);
  at += 8;
  const runs = runsOf(parts.picks);
  for (const b of blocks) {
    page.set(b.head, at);
    at = copyCells(b, parts.rowsCount, runs, page, at + 12);
  }
  d.setUint32(56, pageCrc(page), true);
  return page;
}
