/**
 * The recurrent snapshot of a staged import when it arrives in layer runs (schema 2): on the
 * shim path each run is written into the recurrent tensors as it arrives, at the byte window
 * this context's own layout gives its layers (so a sender's bytes land only where this model
 * keeps them, and a run of the wrong size is refused); on the public path runs are held and
 * joined into one snapshot for llama.cpp's own import. A decoder context that keeps rollback
 * snapshots (`n_rs_seq > 0`, speculation) is windowed the same way: its snapshot bytes are
 * those of a context without them (ffi/recurrent_window_test.ts).
 */
import { StateValidationError } from "../core/errors.ts";
import { firstTilingFault, formatRange, type Range } from "../core/schema.ts";
import type { LlamaContext } from "./context.ts";
import { snapshotPosition } from "./_recurrent_split.ts";
import { type RecurrentLayout, recurrentLayout, shimFailure, type StateBackend } from "./state.ts";

type Part = "conv" | "ssm";

export class RecurrentRuns {
  /** Shim path: this context's snapshot layout, known once the header window is in. */
  #layout: RecurrentLayout | null = null;
  /** Shim path: byte windows imported so far. */
  readonly #windows: Range[] = [];
  /** Public path: runs held until `joined`. */
  #held: { part: Part; r0: number; r1: number; payload: Uint8Array }[] = [];

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

  /** Takes the `part` entries of recurrent layers [r0, r1); throws StateValidationError. */
  async add(part: Part, r0: number, r1: number, payload: Uint8Array): Promise<void> {
    const what = `${part} of recurrent layers [${r0}, ${r1})`;
    if (!Number.isInteger(r0) || !Number.isInteger(r1) || r0 < 0 || r1 <= r0) {
      throw new StateValidationError(`Cannot stage ${what}: empty or invalid layer run`);
    }
    const shim = this.backend.path === "shim" ? this.backend.shim : null;
    if (!shim) {
      // A copy: the caller may recycle its buffers once this returns.
      this.#held.push({ part, r0, r1, payload: payload.slice() });
      return;
    }
    const headed = part === "conv" && r0 === 0;
    const layout = this.#layout;
    if (headed !== (layout === null)) {
      throw new StateValidationError(
        headed
          ? `Cannot stage ${what}: the snapshot header was already staged`
          : `Cannot stage ${what}: the snapshot header (conv from layer 0) must come first`,
        { hint: "send conv runs in layer order, then ssm runs" },
      );
    }
    const from = layout ? this.#window(layout, part, r0, r1, payload, what) : 0;
    if (!layout) this.#checkPosition(payload, what);
    try {
      await this.ctx.serialize(() => shim.importRecurrentWindow(this.ctx, this.seq, from, payload));
    } catch (error) {
      throw shimFailure(error, "stage", what);
    }
    if (!layout) {
      this.#layout = await recurrentLayout(this.ctx, this.seq);
      const end = this.#layout?.conv[r1 - 1]?.end;
      if (end !== payload.byteLength) {
        throw new StateValidationError(
          `Cannot stage ${what}: ${payload.byteLength} bytes, this model keeps ${end}`,
          { hint: "both sides need the same model and numerical identity" },
        );
      }
    }
    this.#windows.push([from, from + payload.byteLength]);
  }

  /** Where a run lies in this context's snapshot; refuses a size or overlap mismatch. */
  #window(
    layout: RecurrentLayout,
    part: Part,
    r0: number,
    r1: number,
    payload: Uint8Array,
    what: string,
  ): number {
    const list = layout[part];
    if (r1 > list.length) {
      throw new StateValidationError(
        `Cannot stage ${what}: this model has ${list.length} recurrent layers`,
      );
    }
    const from = list[r0].start;
    const bytes = list[r1 - 1].end - from;
    if (payload.byteLength !== bytes) {
      throw new StateValidationError(
        `Cannot stage ${what}: ${payload.byteLength} bytes, this model keeps ${bytes}`,
        { hint: "both sides need the same model and numerical identity" },
      );
    }
    const to = from + bytes;
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
   * order), or null when none are held; throws naming a missing or doubled run.
   */
  joined(): Uint8Array<ArrayBuffer> | null {
    if (this.#held.length === 0) return null;
    const order = (part: Part) =>
      this.#held.filter((r) => r.part === part).sort((a, b) => a.r0 - b.r0);
    for (const part of ["conv", "ssm"] as const) {
      let at = 0;
      for (const r of order(part)) {
        if (r.r0 !== at) {
          throw new StateValidationError(
            `Cannot commit: ${part} of recurrent layers ${formatRange([at, r.r0])} ${
              r.r0 > at ? "missing" : "staged twice"
            }`,
          );
        }
        at = r.r1;
      }
    }
    const runs = [...order("conv"), ...order("ssm")];
    const blob = new Uint8Array(runs.reduce((n, r) => n + r.payload.byteLength, 0));
    let at = 0;
    for (const r of runs) {
      blob.set(r.payload, at);
      at += r.payload.byteLength;
    }
    this.#held = [];
    return blob;
  }

  /** Drops (and zeroes) held runs. */
  clear(): void {
    for (const r of this.#held) r.payload.fill(0);
    this.#held = [];
  }
}
