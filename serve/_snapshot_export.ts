/**
 * The final recurrent snapshot of a prefill, exported after its last chunk (what the layer
 * capture did not send): conv chunks, then ssm chunks, each a run of whole layers of about
 * `snapshotChunkBytes`, at most `chunkBytesMax`; one layer larger than that is a run of its
 * own, sent as byte pieces of `chunkBytesMax` (schema 3). Layer ranges tile the trunk: a chunk
 * covers the trunk layers from its first recurrent layer to the next chunk's (the first from 0,
 * the last to the end). On the shim path each chunk or piece is exported as its own window of
 * the snapshot, so the first leaves before the rest is read; on the public path the snapshot
 * is exported whole and cut into views of it.
 */
import { type BytePiece, type Range, StateValidationError } from "../core/mod.ts";
import type { LlamaContext } from "../ffi/mod.ts";
import {
  type EntrySpan,
  entrySpans,
  exportRecurrent,
  exportRecurrentWindow,
  recurrentLayout,
} from "../ffi/state.ts";
import type { ChunkSink, ExportedChunk, ExportLimits } from "./exporter.ts";

export interface SnapshotExportInput {
  ctx: LlamaContext;
  /** The model's layer kinds (numerical identity). */
  layerKinds: readonly string[];
  limits: Pick<ExportLimits, "chunkBytesMax" | "snapshotChunkBytes">;
  /** Recurrent layers (by index) the layer capture already sent: only the others go. */
  captured: ReadonlySet<number>;
  sink: ChunkSink;
  /** Makes the chunk of a conv or ssm run over trunk layers `layers` (or a piece of it). */
  chunk: (
    part: "conv" | "ssm",
    layers: Range,
    payload: Uint8Array,
    piece?: BytePiece,
  ) => ExportedChunk;
}

/** Exports and sends the snapshot's runs and pieces, in order. */
export async function exportSnapshot(o: SnapshotExportInput): Promise<void> {
  const t0 = performance.now();
  const { spans, read } = await snapshotReader(o.ctx);
  const trunkKinds = o.layerKinds.filter((k) => k !== "mtp");
  const recurrentAt = trunkKinds.flatMap((k, i) => (k === "recurrent" ? [i] : []));
  if (recurrentAt.length !== spans.conv.length) {
    throw new StateValidationError(
      `Cannot export conv/ssm: ${spans.conv.length} recurrent layers in the snapshot, ${recurrentAt.length} in the model`,
    );
  }
  let exportMs = performance.now() - t0;
  for (const part of ["conv", "ssm"] as const) {
    const list = spans[part];
    // The first conv run carries the snapshot header.
    const start = (a: number) => (part === "conv" && a === 0 ? 0 : list[a].start);
    // After a partial capture, only the layers it missed, one run each.
    const runs: [number, number][] = o.captured.size === 0
      ? groups(list, start, Math.min(o.limits.snapshotChunkBytes, o.limits.chunkBytesMax))
      : list.flatMap((_, i) => (o.captured.has(i) ? [] : [[i, i] as [number, number]]));
    for (const [first, last] of runs) {
      const a = first === 0 ? 0 : recurrentAt[first];
      const b = last === list.length - 1 ? trunkKinds.length : recurrentAt[last + 1];
      const from = start(first);
      const of = list[last].end - from;
      const step = Math.min(of, o.limits.chunkBytesMax);
      for (let at = 0; at < of; at += step) {
        const end = Math.min(of, at + step);
        const t1 = performance.now();
        const payload = await read(from + at, from + end);
        exportMs += performance.now() - t1;
        const piece = step < of ? { range: [at, end] as Range, of } : undefined;
        await o.sink(o.chunk(part, [a, b], payload, piece), exportMs);
        exportMs = 0;
      }
    }
  }
}

interface SnapshotReader {
  /** Entry spans per part, as offsets into the whole snapshot. */
  spans: { conv: EntrySpan[]; ssm: EntrySpan[] };
  /** Bytes [from, to) of the snapshot. */
  read: (from: number, to: number) => Promise<Uint8Array>;
}

/** Windows through the shim, or views of one public export. */
async function snapshotReader(ctx: LlamaContext): Promise<SnapshotReader> {
  const layout = await recurrentLayout(ctx);
  if (layout) return { spans: layout, read: (from, to) => exportRecurrentWindow(ctx, from, to) };
  const snapshot = await exportRecurrent(ctx);
  if (snapshot.layout !== "split") {
    throw new StateValidationError(
      "Cannot export conv/ssm: this model's recurrent state layout is not one we can split",
      { hint: "use colocated generation for this model" },
    );
  }
  const parts = entrySpans(snapshot);
  const base = snapshot.conv.byteLength;
  const spans = {
    conv: parts.conv,
    ssm: parts.ssm.map((e) => ({ start: e.start + base, end: e.end + base })),
  };
  const blob = new Uint8Array(
    snapshot.conv.buffer,
    snapshot.conv.byteOffset,
    base + snapshot.ssm.byteLength,
  );
  return { spans, read: (from, to) => Promise.resolve(blob.subarray(from, to)) };
}

/**
 * Runs of consecutive entries, `[first, last]` inclusive, where a run of entries a..b spans
 * `[start(a), list[b].end)`: each as long as fits `target` bytes (at least one entry, so a
 * layer larger than that is a run of its own, which leaves in byte pieces).
 */
function groups(
  list: readonly EntrySpan[],
  start: (a: number) => number,
  target: number,
): [number, number][] {
  const out: [number, number][] = [];
  const runBytes = (a: number, b: number) => list[b].end - start(a);
  let first = 0;
  for (let i = 0; i < list.length; i++) {
    if (i + 1 === list.length || runBytes(first, i + 1) > target) {
      out.push([first, i]);
      first = i + 1;
    }
  }
  return out;
}
