/**
 * The final recurrent state of one sequence, layer by layer, while the last ubatch of its
 * prompt still computes: a native eval callback in the shim (./shim/_capture.cpp) observes only
 * the graph nodes that write each recurrent layer's final conv and SSM rows and copies those
 * rows as soon as they are computed, so a prefill worker can send layer `il` while layers after
 * it still run.
 *
 * Each captured layer carries its conv and SSM entries exactly as
 * `llama_state_seq_get_data_ext(PARTIAL_ONLY)` writes them (`{i32 type, u64 row bytes, row}`),
 * and `snapshot()` assembles the whole PARTIAL_ONLY blob from them, byte for byte.
 *
 * Use (single-sequence prompt, last chunk ending at position `finalPos`):
 *
 * ```ts
 * const opened = await LayerCapture.open(ctx);
 * if (!opened.ok) console.error(`layer capture off: ${opened.reason}`); // public export instead
 * using capture = opened.capture;
 * capture.arm(seq, finalPos); // queued on the context, so it applies to the next decode
 * const done = ctx.decode(lastChunk);
 * for await (const layer of capture.layers(done)) send(layer.conv, layer.ssm);
 * await capture.disarm();
 * ```
 *
 * Ownership: the rows live in the shim's buffer until the next `arm` or `close`; `layers()` and
 * `layer()` return copies the caller owns. The callback is on the context only between `arm`
 * and `disarm`; freeing the context closes a capture still open on it, first.
 */
import { assert, RuntimeLibraryError, StateValidationError } from "../core/errors.ts";
import type { LlamaContext } from "./context.ts";
import { loadShim, type Shim } from "./shim/shim.ts";
import { SHIM_CAPINFO, SHIM_CAPTURE } from "./shim/abi.ts";

const SEQ_MAGIC = 0xaf143cd8;
const ENTRY_HEAD_BYTES = 12;
/** Bytes of a one-cell snapshot's header, up to the first conv entry. */
const HEADER_BYTES = 28;
const ERR_BYTES = 512;

/** One recurrent layer's final rows. */
export interface CapturedLayer {
  /** Index among the recurrent layers (0 = first), the order of the snapshot's entries. */
  index: number;
  /** Trunk layer index. */
  layer: number;
  /** The conv entry of the PARTIAL_ONLY snapshot (header + row). */
  conv: Uint8Array<ArrayBuffer>;
  /** The SSM entry of the PARTIAL_ONLY snapshot (header + row). */
  ssm: Uint8Array<ArrayBuffer>;
  /** Steady-clock time the layer became ready (same clock as `LayerCapture.nowNs()`). */
  readyNs: bigint;
}

/** The last page armed with `armPage`. */
export type CapturedPage =
  | { state: "pending" }
  | { state: "failed"; reason: string }
  | { state: "ready"; bytes: Uint8Array<ArrayBuffer>; readyNs: bigint };

export interface ArmOptions {
  /** Copy rows (default true); false records readiness times only (for measurements). */
  copyRows?: boolean;
}

export interface LayersOptions {
  /** Sleep between polls of the native ready counter (default 1 ms). */
  pollMs?: number;
}

/** Counters since the last arm: nodes offered to the callback, nodes observed, copy time. */
export interface CaptureStats {
  asked: number;
  observed: number;
  /** Time the callback spent copying rows (on the decode's critical path). */
  copyMs: number;
}

export type LayerCaptureStatus =
  | { ok: true; capture: LayerCapture }
  | { ok: false; reason: string };

export class LayerCapture implements Disposable {
  #handle: Deno.PointerValue;
  readonly #unhook: () => void;
  #seq = 0;
  #finalPos = -1;
  #copyRows = true;
  /** Recurrent layers (entries per part). */
  readonly nLayers: number;
  /** Trunk layers (the snapshot's `n_layer` field). */
  readonly nTrunkLayers: number;
  readonly convRowBytes: number;
  readonly ssmRowBytes: number;
  /** Trunk index of the last attention layer, whose writes end the last page; -1: none. */
  readonly pageLayer: number;

  private constructor(
    readonly shim: Shim,
    readonly ctx: LlamaContext,
    handle: Deno.PointerObject,
  ) {
    this.#handle = handle;
    this.#unhook = ctx.beforeFree(() => this.close());
    const info = this.#info();
    this.nLayers = info[SHIM_CAPINFO.LAYERS];
    this.nTrunkLayers = info[SHIM_CAPINFO.N_LAYER];
    this.convRowBytes = info[SHIM_CAPINFO.CONV_ROW];
    this.ssmRowBytes = info[SHIM_CAPINFO.SSM_ROW];
    this.pageLayer = info[SHIM_CAPINFO.PAGE_LAYER];
  }

  /**
   * A capture on `ctx`, or why not (no shim, not a recurrent or hybrid context, rollback
   * snapshots on, an eval callback already set, or a layout the shim does not trust).
   */
  static async open(ctx: LlamaContext): Promise<LayerCaptureStatus> {
    const status = await loadShim(ctx.model.lib);
    if (!status.ok) return { ok: false, reason: `no shim: ${status.reason}` };
    const shim = status.shim;
    const tested = shim.selfTest(ctx);
    if (tested !== null) return { ok: false, reason: `shim self-test failed: ${tested}` };
    const err = new Uint8Array(ERR_BYTES);
    const handle = await ctx.serialize(() =>
      shim.symbols.skippy_capture_open(ctx.ptr, err, BigInt(ERR_BYTES))
    );
    if (handle === null) return { ok: false, reason: cText(err) };
    return { ok: true, capture: new LayerCapture(shim, ctx, handle) };
  }

  get #ptr(): Deno.PointerObject {
    if (this.#handle === null) throw new Error("Internal error: layer capture used after close");
    return this.#handle;
  }

  #info(): number[] {
    const out = new BigInt64Array(SHIM_CAPINFO.LEN);
    this.shim.symbols.skippy_capture_info(this.#ptr, out);
    return Array.from(out, Number);
  }

  /**
   * Arms the capture for the decode that leaves `seq`'s recurrent state at `finalPos` (the
   * last position of the prompt's last chunk). Queued on the context: it takes effect after
   * every decode already queued and before any queued after it.
   */
  arm(seq: number, finalPos: number, options: ArmOptions = {}): Promise<void> {
    assert(Number.isInteger(seq) && seq >= 0, `sequence id ${seq}`);
    assert(Number.isInteger(finalPos) && finalPos >= 0, `final position ${finalPos}`);
    const copyRows = options.copyRows ?? true;
    return this.ctx.serialize(() => {
      const err = new Uint8Array(ERR_BYTES);
      const flags = copyRows ? SHIM_CAPTURE.COPY : 0;
      const rc = this.shim.symbols.skippy_capture_arm(
        this.#ptr,
        seq,
        finalPos,
        flags,
        err,
        BigInt(ERR_BYTES),
      );
      if (rc !== 0) throw new RuntimeLibraryError(`Cannot arm the layer capture: ${cText(err)}`);
      this.#seq = seq;
      this.#finalPos = finalPos;
      this.#copyRows = copyRows;
    });
  }

  /**
   * After `arm`: also export the attention cache's page of positions [p0, finalPos + 1) the
   * moment the last attention layer (`pageLayer`) has written the final ubatch's K and V rows,
   * while the layers after it still compute. The page is byte for byte what `exportKvPage`
   * returns after the decode. One larger than `maxBytes` is not exported (`page()` says so).
   * Queued on the context like `arm`.
   */
  armPage(p0: number, maxBytes: number): Promise<void> {
    const p1 = this.#finalPos + 1;
    assert(Number.isInteger(p0) && p0 >= 0 && p0 < p1, `page start ${p0}`);
    return this.ctx.serialize(() => {
      const err = new Uint8Array(ERR_BYTES);
      const rc = this.shim.symbols.skippy_capture_arm_page(
        this.#ptr,
        p0,
        p1,
        BigInt(maxBytes),
        err,
        BigInt(ERR_BYTES),
      );
      if (rc !== 0) throw new RuntimeLibraryError(`Cannot arm the last page: ${cText(err)}`);
    });
  }

  /**
   * The armed page: a copy once exported (`bytes`), `pending` before, or why it could not be
   * (`failed`); never blocks.
   */
  page(): CapturedPage {
    const n = Number(this.shim.symbols.skippy_capture_page_state(this.#ptr));
    if (n === 0) return { state: "pending" };
    if (n < 0) {
      const ptr = this.shim.symbols.skippy_capture_page_error(this.#ptr);
      const why = ptr === null ? "" : new Deno.UnsafePointerView(ptr).getCString();
      return { state: "failed", reason: why || `code ${n}` };
    }
    const bytes = new Uint8Array(n);
    new Deno.UnsafePointerView(this.shim.symbols.skippy_capture_page(this.#ptr)!).copyInto(bytes);
    const readyNs = BigInt(this.shim.symbols.skippy_capture_page_ready_ns(this.#ptr));
    return { state: "ready", bytes, readyNs };
  }

  /** Stops observing nodes (queued on the context, after the armed decode). */
  disarm(): Promise<void> {
    return this.ctx.serialize(() => this.shim.symbols.skippy_capture_disarm(this.#ptr));
  }

  /** Layers ready so far; throws when the capture failed. Never blocks. */
  ready(): number {
    const n = this.shim.symbols.skippy_capture_ready(this.#ptr);
    if (n < 0) {
      const ptr = this.shim.symbols.skippy_capture_error(this.#ptr);
      const why = ptr === null ? "" : new Deno.UnsafePointerView(ptr).getCString();
      throw new StateValidationError(`Layer capture failed: ${why || `code ${n}`}`, {
        hint: "send the recurrent snapshot with a full PARTIAL_ONLY export instead",
      });
    }
    return n;
  }

  /** Whether recurrent layer `index` is ready (never blocks). */
  isReady(index: number): boolean {
    return this.shim.symbols.skippy_capture_is_ready(this.#ptr, index) === 1;
  }

  /** When recurrent layer `index` became ready (0n = not yet). */
  readyNs(index: number): bigint {
    return BigInt(this.shim.symbols.skippy_capture_ready_ns(this.#ptr, index));
  }

  /** The shim's steady clock, for comparing with `readyNs`. */
  nowNs(): bigint {
    return BigInt(this.shim.symbols.skippy_capture_now_ns());
  }

  /** Copies of recurrent layer `index`'s entries, or null while it is not ready. */
  layer(index: number): CapturedLayer | null {
    assert(index >= 0 && index < this.nLayers, `recurrent layer ${index}`);
    if (!this.isReady(index)) return null;
    assert(this.#copyRows, "rows were not copied (armed with copyRows: false)");
    const base = this.shim.symbols.skippy_capture_entries(this.#ptr)!;
    const view = new Deno.UnsafePointerView(base);
    const convEntry = ENTRY_HEAD_BYTES + this.convRowBytes;
    const ssmEntry = ENTRY_HEAD_BYTES + this.ssmRowBytes;
    const conv = new Uint8Array(convEntry);
    const ssm = new Uint8Array(ssmEntry);
    view.copyInto(conv, index * convEntry);
    view.copyInto(ssm, this.nLayers * convEntry + index * ssmEntry);
    const layer = this.shim.symbols.skippy_capture_layer(this.#ptr, index);
    return { index, layer, conv, ssm, readyNs: this.readyNs(index) };
  }

  /**
   * Yields each recurrent layer, in snapshot order, as soon as it is ready. `done` is the
   * armed decode's promise: when it settles and a layer is still missing, this throws (the
   * decode did not reach `finalPos` in one ubatch, or failed), so a caller never sends a
   * partial snapshot as if it were whole.
   */
  async *layers(
    done: Promise<unknown>,
    options: LayersOptions = {},
  ): AsyncGenerator<CapturedLayer> {
    const pollMs = options.pollMs ?? 1;
    let settled = false;
    const finished = done.then(() => {
      settled = true;
    }, () => {
      settled = true;
    });
    let next = 0;
    while (next < this.nLayers) {
      this.ready();
      if (this.isReady(next)) {
        yield this.layer(next++)!;
        continue;
      }
      if (settled) {
        await done; // rethrows the decode's own failure first
        throw new StateValidationError(
          `Layer capture got ${this.ready()} of ${this.nLayers} recurrent layers of sequence ${this.#seq} at position ${this.#finalPos}`,
          { hint: "arm with the last position of the decode's batch; fall back to a full export" },
        );
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        finished,
        new Promise<void>((resolve) => timer = setTimeout(resolve, pollMs)),
      ]);
      clearTimeout(timer);
    }
  }

  /**
   * The PARTIAL_ONLY snapshot assembled from the captured layers (all must be ready): equal,
   * byte for byte, to `llama_state_seq_get_data_ext(seq, PARTIAL_ONLY)` after the decode.
   */
  snapshot(): Uint8Array<ArrayBuffer> {
    const n = this.ready();
    if (n !== this.nLayers) {
      throw new StateValidationError(`Layer capture holds ${n} of ${this.nLayers} layers`);
    }
    assert(this.#copyRows, "rows were not copied (armed with copyRows: false)");
    const head = HEADER_BYTES;
    const bytes = this.#info()[SHIM_CAPINFO.BYTES];
    const out = new Uint8Array(head + bytes);
    out.set(this.header());
    const base = this.shim.symbols.skippy_capture_entries(this.#ptr)!;
    new Deno.UnsafePointerView(base).copyInto(out.subarray(head));
    return out;
  }

  /**
   * The snapshot header of the armed sequence and position (magic, seq, one cell at
   * `finalPos`, s_trans, n_layer): what precedes the first conv entry in the PARTIAL_ONLY blob.
   */
  header(): Uint8Array<ArrayBuffer> {
    const out = new Uint8Array(HEADER_BYTES);
    const d = new DataView(out.buffer);
    d.setUint32(0, SEQ_MAGIC, true);
    d.setInt32(4, this.#seq, true);
    d.setUint32(8, 1, true); // cell count
    d.setInt32(12, this.#finalPos, true);
    d.setUint32(16, 0, true); // n_seq_id (0: a single-sequence export)
    d.setUint32(20, 0, true); // s_trans
    d.setUint32(24, this.nTrunkLayers, true);
    return out;
  }

  stats(): CaptureStats {
    const info = this.#info();
    return {
      asked: info[SHIM_CAPINFO.ASKED],
      observed: info[SHIM_CAPINFO.OBSERVED],
      copyMs: info[SHIM_CAPINFO.COPY_NS] / 1e6,
    };
  }

  /**
   * Removes the callback from the context and frees the rows. Idempotent; freeing the context
   * closes a capture still open.
   */
  close(): void {
    if (this.#handle === null) return;
    this.shim.symbols.skippy_capture_close(this.#handle);
    this.#handle = null;
    this.#unhook();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

function cText(buf: Uint8Array): string {
  const end = buf.indexOf(0);
  return new TextDecoder().decode(buf.subarray(0, end < 0 ? buf.length : end)) || "no reason given";
}
