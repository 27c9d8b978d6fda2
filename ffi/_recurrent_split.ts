/**
 * Splits a recurrent snapshot (`llama_state_seq_get_data_ext` with PARTIAL_ONLY on a hybrid
 * or recurrent context) into its conv and SSM parts, and joins them back byte for byte.
 *
 * Layout (llama_memory_recurrent::state_write): u32 magic | i32 seq | u32 cell_count | per cell
 * {i32 pos, u32 n_seq_id, seq ids} | u32 s_trans | u32 n_layer (all trunk layers) | per
 * recurrent layer {i32 type, u64 row bytes, rows} for conv, then the same for SSM.
 *
 * `conv` keeps everything up to the first SSM entry (the header travels with it); `ssm` is the
 * rest. The split is accepted only when the entries parse exactly to the end and form two
 * equal runs with one row size each; otherwise (a layout this code does not know, such as the
 * extra per-layer rows some architectures add) the snapshot stays one `whole` blob.
 */

const SEQ_MAGIC = 0xaf143cd8;

export type RecurrentSnapshot =
  | { layout: "split"; conv: Uint8Array; ssm: Uint8Array }
  | { layout: "whole"; blob: Uint8Array };

/** The recurrent position the snapshot was taken at, or null when it holds no cell. */
export function snapshotPosition(first: Uint8Array): number | null {
  if (first.byteLength < 20) return null;
  const d = new DataView(first.buffer, first.byteOffset, first.byteLength);
  if (d.getUint32(0, true) !== SEQ_MAGIC || d.getUint32(8, true) === 0) return null;
  return d.getInt32(12, true);
}

interface Entry {
  at: number;
  row: number;
}

function entries(blob: Uint8Array): Entry[] | null {
  const spans = parseEntries(blob, true);
  if (!spans) return null;
  const d = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
  return spans.map((sp) => ({ at: sp.start, row: Number(d.getBigUint64(sp.start + 4, true)) }));
}

/**
 * Bytes of conv and SSM rows in a snapshot (framing and cell metadata excluded), or null when
 * its layout is not the known one: the recurrent state as the runtime holds it.
 */
export function recurrentPayloadBytes(blob: Uint8Array): number | null {
  const list = entries(blob);
  if (!list) return null;
  const d = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
  const cells = d.getUint32(8, true);
  return list.reduce((sum, e) => sum + e.row * cells, 0);
}

/** Splits a snapshot into conv and SSM parts when its layout is the known one. */
export function splitRecurrent(blob: Uint8Array): RecurrentSnapshot {
  const list = entries(blob);
  if (!list || list.length === 0 || list.length % 2 !== 0) return { layout: "whole", blob };
  const half = list.length / 2;
  const uniform = (xs: Entry[]) => xs.every((e) => e.row === xs[0].row);
  if (!uniform(list.slice(0, half)) || !uniform(list.slice(half))) return { layout: "whole", blob };
  const cut = list[half].at;
  return { layout: "split", conv: blob.subarray(0, cut), ssm: blob.subarray(cut) };
}

/** The snapshot as one blob, as llama.cpp reads it. */
export function joinRecurrent(s: RecurrentSnapshot): Uint8Array<ArrayBuffer> {
  if (s.layout === "whole") {
    // Already one blob of its own (the decoder joins chunks into a fresh buffer): no copy.
    const own = s.blob.buffer instanceof ArrayBuffer && s.blob.byteOffset === 0 &&
      s.blob.byteLength === s.blob.buffer.byteLength;
    return own ? s.blob as Uint8Array<ArrayBuffer> : s.blob.slice();
  }
  const out = new Uint8Array(s.conv.byteLength + s.ssm.byteLength);
  out.set(s.conv);
  out.set(s.ssm, s.conv.byteLength);
  return out;
}

/** The first part of a snapshot (the one that carries its header). */
export function snapshotHead(s: RecurrentSnapshot): Uint8Array {
  return s.layout === "split" ? s.conv : s.blob;
}

/** Where one recurrent layer's entry (`{i32 type, u64 row bytes, rows}`) lies in its part. */
export interface EntrySpan {
  start: number;
  end: number;
}

/**
 * Parses the entries of a conv or ssm part (or of one chunk of it): `headed` when it starts
 * with the snapshot header (the conv part, and the first conv chunk). Rows are per cell; a
 * part without the header is read with `cells` (1 for a one-sequence snapshot). Null when it
 * does not parse to exactly its end.
 */
function parseEntries(payload: Uint8Array, headed: boolean, cells = 1): EntrySpan[] | null {
  const d = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  let at = 0;
  if (headed) {
    if (payload.byteLength < 12 || d.getUint32(0, true) !== SEQ_MAGIC) return null;
    cells = d.getUint32(8, true);
    at = 12;
    for (let i = 0; i < cells; i++) {
      if (at + 8 > payload.byteLength) return null;
      at += 8 + 4 * d.getUint32(at + 4, true);
    }
    if (at + 8 > payload.byteLength || d.getUint32(at, true) !== 0) return null;
    at += 8;
  }
  const spans: EntrySpan[] = [];
  while (at < payload.byteLength) {
    if (at + 12 > payload.byteLength) return null;
    const type = d.getInt32(at, true);
    const row = Number(d.getBigUint64(at + 4, true));
    const end = at + 12 + row * cells;
    if (type < 0 || type > 64 || row === 0 || end > payload.byteLength) return null;
    spans.push({ start: at, end });
    at = end;
  }
  return spans;
}

/**
 * The entry spans of a split snapshot, one per recurrent layer in layer order: `conv` spans
 * index into `s.conv` (the first starts after the header, which is `conv[0].start` bytes
 * long), `ssm` spans into `s.ssm`. Adjacent spans are contiguous, so a run of layers is one
 * view of its part: a snapshot is cut into chunks without copying it.
 */
export function entrySpans(
  s: { conv: Uint8Array; ssm: Uint8Array },
): { conv: EntrySpan[]; ssm: EntrySpan[] } {
  const conv = parseEntries(s.conv, true);
  const cells = new DataView(s.conv.buffer, s.conv.byteOffset, 12).getUint32(8, true);
  const ssm = parseEntries(s.ssm, false, cells);
  if (!conv || !ssm || conv.length !== ssm.length) {
    throw new Error("not a split recurrent snapshot");
  }
  return { conv, ssm };
}

/** The number of recurrent-layer entries in a conv or ssm chunk payload, or null. */
export function countEntries(payload: Uint8Array, headed: boolean): number | null {
  return parseEntries(payload, headed)?.length ?? null;
}
