/**
 * The recurrent snapshot of a staged import when it arrives in layer runs (schema 2), a run
 * larger than a chunk in byte pieces (schema 3): on the shim path each run or piece is written
 * into the recurrent tensors as it arrives, at the byte window this context's own layout gives
 * its layers (so a sender's bytes land only where this model keeps them, and a run of the
 * wrong size is refused); on the public path runs are held and joined into one snapshot for
 * llama.cpp's own import. A decoder context that keeps rollback snapshots (`n_rs_seq > 0`,
 * speculation) is windowed the same way: its snapshot bytes are those of a context without
 * them (ffi/recurrent_window_test.ts).
 */
import { StateValidationError } from "../core/errors.ts";
import { firstTilingFault, formatRange, type Range } from "../core/schema.ts";
import type { LlamaContext } from "./context.ts";
import { snapshotPosition } from "./_recurrent_split.ts";
import { type RecurrentLayout, recurrentLayout, shimFailure, type StateBackend } from "./state.ts";

type Part = "conv" | "ssm";

/** Where a payload lies in its run: bytes [offset, offset + payload) of a run of `of` bytes. */
export interface RunPiece {
  offset: number;
  of: number;
}

interface Held {
  part: Part;
  r0: number;
  r1: number;
  piece: RunPiece;
  payload: Uint8Array;
}

export class RecurrentRuns {
  /** Shim path: this context's snapshot layout, known once the header window is in. */
  #layout: RecurrentLayout | null = null;
  /** Shim path: byte windows imported so far. */
  readonly #windows: Range[] = [];
  /** Public path: runs (or pieces of runs) held until `joined`. */
  #held: Held[] = [];

  constructor(
    readonly ctx: LlamaContext,
    readonly backend: StateBackend,
    readonly seq: number,
    readonly nTokens: number,
  ) {}

  /** True once runs went into the context itself (the shim path). */
  get windowed(): boolean {
    return this.#layout !== null;
  }

  /**
   * Takes the `part` entries of recurrent layers [r0, r1), or bytes `piece` of them (a run
   * larger than a chunk); throws StateValidationError.
   */
  async add(
    part: Part,
    r0: number,
    r1: number,
    payload: Uint8Array,
    piece?: RunPiece,
  ): Promise<void> {
    const at = piece ? ` bytes [${piece.offset}, ${piece.offset + payload.byteLength})` : "";
    const what = `${part} of recurrent layers [${r0}, ${r1})${at}`;
    if (!Number.isInteger(r0) || !Number.isInteger(r1) || r0 < 0 || r1 <= r0) {
      throw new StateValidationError(`Cannot stage ${what}: empty or invalid layer run`);
    }
    const p = piece ?? { offset: 0, of: payload.byteLength };
    const pieceOk = Number.isSafeInteger(p.offset) && p.offset >= 0 && payload.byteLength > 0 &&
      p.offset + payload.byteLength <= p.of;
    if (!pieceOk) {
      throw new StateValidationError(`Cannot stage ${what}: not within a run of ${p.of} bytes`);
    }
    const shim = this.backend.path === "shim" ? this.backend.shim : null;
    if (!shim) {
      // A copy: the caller may recycle its buffers once this returns.
      this.#held.push({ part, r0, r1, piece: p, payload: payload.slice() });
      return;
    }
    // The snapshot header is the first bytes of the conv run from layer 0.
    const headed = part === "conv" && r0 === 0 && p.offset === 0;
    const layout = this.#layout;
    if (headed !== (layout === null)) {
      throw new StateValidationError(
        headed
          ? `Cannot stage ${what}: the snapshot header was already staged`
          : `Cannot stage ${what}: the snapshot header (conv from layer 0) must come first`,
        { hint: "send conv runs in layer order, then ssm runs" },
      );
    }
    const from = layout ? this.#window(layout, part, r0, r1, p, payload, what) : 0;
    if (!layout) this.#checkPosition(payload, what);
    try {
      await this.ctx.serialize(() => shim.importRecurrentWindow(this.ctx, this.seq, from, payload));
    } catch (error) {
      throw shimFailure(error, "stage", what);
    }
    if (!layout) {
      this.#layout = await recurrentLayout(this.ctx, this.seq);
      const end = this.#layout?.conv[r1 - 1]?.end;
      if (end !== p.of) {
        throw new StateValidationError(
          `Cannot stage ${what}: a run of ${p.of} bytes, this model keeps ${end}`,
          { hint: "both sides need the same model and numerical identity" },
        );
      }
    }
    this.#windows.push([from, from + payload.byteLength]);
  }

  /** Where a run's piece lies in this context's snapshot; refuses a size or overlap mismatch. */
  #window(
    layout: RecurrentLayout,
    part: Part,
    r0: number,
    r1: number,
    piece: RunPiece,
    payload: Uint8Array,
    what: string,
  ): number {
    const list = layout[part];
    if (r1 > list.length) {
      throw new StateValidationError(
        `Cannot stage ${what}: this model has ${list.length} recurrent layers`,
      );
    }
    // The conv run from layer 0 starts with the snapshot header.
    const start = part === "conv" && r0 === 0 ? 0 : list[r0].start;
    const bytes = list[r1 - 1].end - start;
    if (piece.of !== bytes) {
      throw new StateValidationError(
        `Cannot stage ${what}: a run of ${piece.of} bytes, this model keeps ${bytes}`,
        { hint: "both sides need the same model and numerical identity" },
      );
    }
    const from = start + piece.offset;
    const to = from + payload.byteLength;
    if (this.#windows.some(([a, b]) => a < to && from < b)) {
      throw new StateValidationError(`Cannot stage ${what}: staged twice`);
    }
    return from;
  }

  #checkPosition(header: Uint8Array, what: string): void {
    const pos = snapshotPosition(header);
    if (pos !== this.nTokens - 1) {
      throw new StateValidationError(
        `Cannot stage ${what}: the snapshot is at position ${pos}, expected ${this.nTokens - 1}`,
        { hint: "send the recurrent snapshot once, after the last prefill chunk" },
      );
    }
  }

  /** Shim path: throws unless the imported windows cover the whole snapshot exactly once. */
  checkComplete(): void {
    const fault = this.#layout ? firstTilingFault(this.#windows, this.#layout.bytes) : null;
    if (fault) {
      throw new StateValidationError(
        `Cannot commit: conv/ssm snapshot bytes ${formatRange(fault.range)} ${
          fault.fault === "gap" ? "missing" : "staged twice"
        }`,
        { hint: "every layer run of the snapshot must arrive before commit" },
      );
    }
  }

  /**
   * Public path: the held runs as one snapshot (conv runs, then ssm runs, each in layer
   * order, the pieces of a run in byte order), or null when none are held; throws naming a
   * missing or doubled run or piece.
   */
  joined(): Uint8Array<ArrayBuffer> | null {
    if (this.#held.length === 0) return null;
    const order = (part: Part) =>
      this.#held.filter((r) => r.part === part).sort((a, b) =>
        a.r0 - b.r0 || a.r1 - b.r1 || a.piece.offset - b.piece.offset
      );
    for (const part of ["conv", "ssm"] as const) {
      let at = 0;
      let inRun = 0; // bytes of the current run seen so far
      let run: Held | null = null;
      for (const r of order(part)) {
        const same = run !== null && r.r0 === run.r0 && r.r1 === run.r1;
        if (same && r.piece.offset !== inRun) {
          const gap = r.piece.offset > inRun;
          throw new StateValidationError(
            `Cannot commit: ${part} of recurrent layers ${formatRange([r.r0, r.r1])} bytes ${
              formatRange(gap ? [inRun, r.piece.offset] : [r.piece.offset, inRun])
            } ${gap ? "missing" : "staged twice"}`,
          );
        }
        if (!same) {
          this.#checkRunEnd(run, inRun);
          if (r.r0 !== at || r.piece.offset !== 0) {
            const hole = r.r0 > at || (r.r0 === at && r.piece.offset > 0);
            throw new StateValidationError(
              `Cannot commit: ${part} of recurrent layers ${
                formatRange(r.r0 === at ? [r.r0, r.r1] : [at, r.r0])
              } ${hole ? "missing" : "staged twice"}`,
            );
          }
          run = r;
          inRun = 0;
        }
        inRun += r.payload.byteLength;
        at = r.r1;
      }
      this.#checkRunEnd(run, inRun);
    }
    const runs = [...order("conv"), ...order("ssm")];
    const blob = new Uint8Array(runs.reduce((n, r) => n + r.payload.byteLength, 0));
    let at = 0;
    for (const r of runs) {
      blob.set(r.payload, at);
      at += r.payload.byteLength;
    }
    this.clear();
    return blob;
  }

  /** Throws unless a held run's pieces reached its end. */
  #checkRunEnd(run: Held | null, seen: number): void {
    if (run === null || seen === run.piece.of) return;
    throw new StateValidationError(
      `Cannot commit: ${run.part} of recurrent layers ${formatRange([run.r0, run.r1])} bytes ${
        formatRange([seen, run.piece.of])
      } missing`,
    );
  }

  /** Drops (and zeroes) held runs. */
  clear(): void {
    for (const r of this.#held) r.payload.fill(0);
    this.#held = [];
  }
}
