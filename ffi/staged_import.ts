/**
 * The decoder side of a state handoff: an uncommitted session that stages pages as they arrive,
 * takes the final snapshots, checks readiness, and only on `commit()` lets the context decode.
 *
 * Ownership: while staging, the import holds the context (and the MTP draft context) and
 * `decode` through it throws; `commit()` hands it back ready; `abort()` wipes the sequence and
 * hands it back empty. Page buffers are not kept on the shim path (each page is appended as it
 * arrives, so the import cost is off the handoff's tail); the public path keeps them, bounded
 * by `stagedBytesMax`, until `validate()` assembles them.
 *
 * @example
 * ```ts
 * const imp = await StagedImport.open(ctx, { nTokens });
 * for await (const page of pages) await imp.addPage(page);
 * await imp.setRecurrent(snapshot);
 * await imp.commit(); // throws, naming the component and range, if anything is missing
 * ```
 */
import { LimitExceededError, StateValidationError } from "../core/errors.ts";
import { DEFAULT_STATE_BOUNDS, formatRange, type Range } from "../core/schema.ts";
import type { LlamaContext } from "./context.ts";
import { LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY } from "./llama.ts";
import {
  joinRecurrent,
  type RecurrentSnapshot,
  snapshotHead,
  snapshotPosition,
} from "./_recurrent_split.ts";
import { pageCrc, pageRows, readPageHeader } from "./_state_page.ts";
import { type StagedPage } from "./_state_public.ts";
import { type CacheName, type Shim } from "./shim/shim.ts";
import { shimFailure, type StateBackend, stateBackend, type StatePath } from "./state.ts";
import { RecurrentRuns, type RunPiece } from "./_staged_recurrent.ts";
import { assembleFinal, checkLayout, checkReadiness, type Target } from "./_staged_final.ts";
import { addPageRange, checkPageRange, checkTiling } from "./_staged_ranges.ts";

export interface StagedImportOptions {
  /** The handoff carries positions [0, nTokens) (the prompt length). */
  nTokens: number;
  /** Destination sequence (default 0); it must be empty. */
  seq?: number;
  /** MTP draft context for `mtp-kv` pages; held and committed together with `ctx`. */
  draft?: LlamaContext;
  /** `auto` (default) uses the native shim when it can. */
  path?: "auto" | "public";
  /** Largest page accepted (default: the schema's chunk payload bound). */
  pageBytesMax?: number;
  /** Public path: most page bytes held until assembly (default: the schema's state bound). */
  stagedBytesMax?: number;
  /** Most pages per context (default: the schema's chunk bound). */
  pagesMax?: number;
}

export type ImportState = "staging" | "validated" | "committed" | "aborted";

/** What a committed import hands to the decode loop besides the contexts. */
export interface CommittedImport {
  /** The pending MTP hidden row, when a draft context was imported. */
  mtpHidden: Float32Array | null;
}

const HOLDER = "an uncommitted state import";

export class StagedImport {
  #state: ImportState = "staging";
  #releases: (() => void)[];
  #stagedBytes = 0;
  readonly #main: Target;
  readonly #draft: Target | null;
  #recurrent: Uint8Array<ArrayBuffer> | null = null;
  /** The recurrent snapshot when it arrives in layer runs (schema 2). */
  readonly #runs: RecurrentRuns;
  #swa: Uint8Array | null = null;
  #hidden: Float32Array | null = null;

  private constructor(
    readonly ctx: LlamaContext,
    readonly backend: StateBackend,
    main: Target,
    draft: Target | null,
    readonly options: Required<Omit<StagedImportOptions, "draft" | "path">>,
  ) {
    this.#main = main;
    this.#draft = draft;
    this.#runs = new RecurrentRuns(ctx, backend, options.seq, options.nTokens);
    // A context shared by several sessions (n_seq_max > 1) keeps decoding the others: only
    // the destination sequence is held.
    const hold = (c: LlamaContext) =>
      c.options.nSeqMax !== undefined && c.options.nSeqMax > 1
        ? c.holdSequence(options.seq, HOLDER)
        : c.hold(HOLDER);
    this.#releases = [hold(ctx), ...(draft ? [hold(draft.ctx)] : [])];
  }

  /** Opens an import into the empty sequence `seq` of `ctx` (and of `options.draft`). */
  static async open(ctx: LlamaContext, options: StagedImportOptions): Promise<StagedImport> {
    const seq = options.seq ?? 0;
    if (!Number.isInteger(options.nTokens) || options.nTokens < 1) {
      throw new StateValidationError(`Cannot open a state import of ${options.nTokens} tokens`);
    }
    const backend = await stateBackend(ctx, options.path);
    const main: Target = { ctx, backend, component: "kv-page", ranges: [], pages: [] };
    let draft: Target | null = null;
    if (options.draft) {
      const b = await stateBackend(
        options.draft,
        backend.path === "public" ? "public" : options.path,
      );
      draft = { ctx: options.draft, backend: b, component: "mtp-kv", ranges: [], pages: [] };
    }
    for (const t of [main, ...(draft ? [draft] : [])]) {
      // Serialized for a shared context (see `validate`).
      const posMax = await t.ctx.serialize(() => t.ctx.seqPosMax(seq));
      if (posMax !== -1 || t.ctx.heldBy !== null || t.ctx.sequenceHeldBy(seq)) {
        throw new StateValidationError(
          `Cannot open a state import into sequence ${seq}: it already holds state`,
          { hint: "import into a cleared sequence of a context that nothing else is using" },
        );
      }
    }
    const bounds = DEFAULT_STATE_BOUNDS;
    return new StagedImport(ctx, backend, main, draft, {
      nTokens: options.nTokens,
      seq,
      pageBytesMax: options.pageBytesMax ?? bounds.chunkPayloadBytesMax,
      stagedBytesMax: options.stagedBytesMax ?? bounds.stateBytesMax,
      pagesMax: options.pagesMax ?? bounds.chunksMax,
    });
  }

  get state(): ImportState {
    return this.#state;
  }

  /** The path pages take into this context. */
  get path(): StatePath {
    return this.backend.path;
  }

  /** Stages one attention KV page (any order). */
  addPage(page: Uint8Array): Promise<void> {
    return this.#stagePage(this.#main, page);
  }

  /** Stages one page of the MTP draft context's KV. */
  async addMtpPage(page: Uint8Array): Promise<void> {
    if (!this.#draft) {
      throw new StateValidationError("Cannot stage mtp-kv: this import has no draft context");
    }
    await this.#stagePage(this.#draft, page);
  }

  async #stagePage(t: Target, page: Uint8Array): Promise<void> {
    this.#mustStage(t.component);
    if (page.byteLength > this.options.pageBytesMax) {
      throw new LimitExceededError(
        `Cannot stage ${t.component}: ${page.byteLength} bytes exceeds the page bound of ${this.options.pageBytesMax}`,
      );
    }
    const h = readPageHeader(page, t.component);
    const range: Range = [h.p0, h.p1];
    const what = `${t.component} tokens ${formatRange(range)}`;
    checkPageRange(t, h.cache, range, what, this.options);
    const rows = pageRows(page, h, what);
    checkLayout(
      t.ctx,
      h.flags,
      h.kvSize,
      rows.k.map((b) => b.type),
      rows.v.map((b) => b.type),
      what,
    );
    if (t.backend.shim) {
      const shim = t.backend.shim;
      const seq = this.options.seq;
      try {
        await t.ctx.serialize(() => shim.importPage(t.ctx, "main", seq, page));
      } catch (error) {
        throw shimFailure(error, "stage", what);
      }
    } else {
      if (pageCrc(page) !== h.crc) {
        throw new StateValidationError(`Cannot stage ${what}: checksum mismatch`);
      }
      this.#hold(page.byteLength, what);
      // A copy: the caller may recycle its page buffers once this returns.
      const own = page.slice();
      t.pages.push({ header: h, page: own, rows: pageRows(own, h, what) } satisfies StagedPage);
    }
    addPageRange(t, range);
  }

  /** Takes the final recurrent (conv + SSM) snapshot. */
  async setRecurrent(snapshot: RecurrentSnapshot): Promise<void> {
    this.#mustStage("conv/ssm");
    const what = `conv/ssm tokens [0, ${this.options.nTokens})`;
    if (this.backend.kind !== "hybrid" && this.backend.kind !== "recurrent") {
      throw new StateValidationError(`Cannot stage ${what}: this context has no recurrent state`);
    }
    const pos = snapshotPosition(snapshotHead(snapshot));
    if (this.#runs.windowed) {
      throw new StateValidationError(`Cannot stage ${what}: snapshot runs were already staged`);
    }
    if (pos !== this.options.nTokens - 1 || this.#recurrent) {
      throw new StateValidationError(
        this.#recurrent
          ? `Cannot stage ${what}: a snapshot was already staged`
          : `Cannot stage ${what}: the snapshot is at position ${pos}, expected ${
            this.options.nTokens - 1
          }`,
        { hint: "send the recurrent snapshot once, after the last prefill chunk" },
      );
    }
    const blob = joinRecurrent(snapshot);
    if (this.backend.path === "shim" || this.backend.kind === "recurrent") {
      await this.#importPartial(blob, what);
    }
    this.#recurrent = blob;
  }

  /**
   * Takes a run of the final recurrent snapshot: the `part` entries of recurrent layers
   * [r0, r1) (counted among recurrent layers only), as the exporter cuts them. The run of conv
   * from layer 0 carries the snapshot header and must come first. A run larger than a chunk
   * comes in byte pieces (`piece`: where `payload` lies in the run, schema 3). On the shim path
   * each run or piece is written into the recurrent tensors as it arrives; on the public path
   * they are held (bounded by `stagedBytesMax`) and imported together at `validate`.
   */
  async addRecurrentLayers(
    part: "conv" | "ssm",
    r0: number,
    r1: number,
    payload: Uint8Array,
    piece?: RunPiece,
  ): Promise<void> {
    const what = `${part} of recurrent layers [${r0}, ${r1})`;
    this.#mustStage(what);
    if (this.backend.kind !== "hybrid" && this.backend.kind !== "recurrent") {
      throw new StateValidationError(`Cannot stage ${what}: this context has no recurrent state`);
    }
    if (this.#recurrent) {
      throw new StateValidationError(`Cannot stage ${what}: a whole snapshot was already staged`);
    }
    if (this.backend.path !== "shim") this.#hold(payload.byteLength, what);
    await this.#runs.add(part, r0, r1, payload, piece);
  }

  /** Takes the final sliding-window cache (the page `exportSwa` makes). */
  async setSwa(bytes: Uint8Array): Promise<void> {
    this.#mustStage("swa-kv");
    const what = `swa-kv tokens [0, ${this.options.nTokens})`;
    if (this.backend.kind !== "iswa" || this.#swa) {
      throw new StateValidationError(
        this.#swa
          ? `Cannot stage ${what}: already staged`
          : `Cannot stage ${what}: this context has no sliding-window cache`,
      );
    }
    // Joined from its byte pieces (schema 3): bounded by what an import may hold, not a chunk.
    if (bytes.byteLength > this.options.stagedBytesMax) {
      throw new LimitExceededError(
        `Cannot stage ${what}: ${bytes.byteLength} bytes exceeds stagedBytesMax ${this.options.stagedBytesMax}`,
      );
    }
    const h = readPageHeader(bytes, "swa-kv");
    const rows = pageRows(bytes, h, what);
    checkLayout(
      this.ctx,
      h.flags,
      h.kvSize,
      rows.k.map((b) => b.type),
      rows.v.map((b) => b.type),
      what,
    );
    if (h.cache !== 1 || h.p1 !== this.options.nTokens) {
      throw new StateValidationError(
        `Cannot stage ${what}: the page covers [${h.p0}, ${h.p1}) of cache ${h.cache}`,
      );
    }
    if (this.backend.shim) {
      await this.#shimImport(this.backend.shim, "swa", bytes, what);
    } else if (this.ctx.options.swaFull === false) {
      // Without the shim cells land from cell 0 in position order: the source's layout only
      // when the window cache is full-size (measured: a wrapped ring diverges within tokens).
      throw new StateValidationError(
        `Cannot stage ${what} exactly into a ring sliding-window cache without the native shim`,
        { hint: "build the shim (`deno run -A ffi/shim/build.ts`), or use swaFull on both sides" },
      );
    } else if (pageCrc(bytes) !== h.crc) {
      throw new StateValidationError(`Cannot stage ${what}: checksum mismatch`);
    }
    this.#swa = this.backend.shim ? bytes : bytes.slice();
  }

  /** Takes the pending MTP hidden row (n_embd little-endian f32). */
  setMtpHidden(bytes: Uint8Array): void {
    this.#mustStage("mtp-hidden");
    const expected = this.ctx.nEmbd * 4;
    if (!this.#draft || bytes.byteLength !== expected) {
      throw new StateValidationError(
        this.#draft
          ? `Cannot stage mtp-hidden: ${bytes.byteLength} bytes, expected ${expected}`
          : "Cannot stage mtp-hidden: this import has no draft context",
      );
    }
    this.#hidden = new Float32Array(bytes.slice().buffer);
  }

  async #shimImport(shim: Shim, cache: CacheName, page: Uint8Array, what: string): Promise<void> {
    try {
      await this.ctx.serialize(() => shim.importPage(this.ctx, cache, this.options.seq, page));
    } catch (error) {
      throw shimFailure(error, "stage", what);
    }
  }

  async #importPartial(blob: Uint8Array<ArrayBuffer>, what: string): Promise<void> {
    try {
      await this.ctx.stateSeqSet(blob, this.options.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    } catch (error) {
      throw new StateValidationError(`Cannot stage ${what}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }

  #hold(bytes: number, what: string): void {
    if (this.#stagedBytes + bytes > this.options.stagedBytesMax) {
      throw new LimitExceededError(
        `Cannot stage ${what}: staged state would exceed ${this.options.stagedBytesMax} bytes`,
      );
    }
    this.#stagedBytes += bytes;
  }

  #mustStage(what: string): void {
    if (this.#state !== "staging") {
      throw new StateValidationError(`Cannot stage ${what}: the import is ${this.#state}`);
    }
  }

  /**
   * Readiness check (and, on the public path, the one import of the assembled state). Throws
   * StateValidationError naming the missing or inconsistent component; the import stays
   * uncommitted either way.
   */
  async validate(): Promise<void> {
    this.#mustStage("state");
    const n = this.options.nTokens;
    const targets = [this.#main, ...(this.#draft ? [this.#draft] : [])];
    checkTiling(targets, n);
    const k = this.backend.kind;
    const joined = this.#runs.joined();
    if (joined) {
      this.#stagedBytes = 0;
      await this.setRecurrent({ layout: "whole", blob: joined });
    }
    if (this.#runs.windowed) {
      this.#runs.checkComplete();
    } else if ((k === "hybrid" || k === "recurrent") && !this.#recurrent) {
      throw new StateValidationError(`Cannot commit: conv/ssm tokens [0, ${n}) missing`);
    }
    if (k === "iswa" && !this.#swa) {
      throw new StateValidationError(`Cannot commit: swa-kv tokens [0, ${n}) missing`);
    }
    if (this.#draft && !this.#hidden) {
      throw new StateValidationError("Cannot commit: mtp-hidden missing");
    }
    for (const t of targets) {
      try {
        if (t.backend.path === "public") {
          const tail = t === this.#main ? { recurrent: this.#recurrent, swa: this.#swa } : {};
          await assembleFinal(t, this.options.seq, tail);
        }
        // Serialized: on a shared context other sequences may be decoding right now, and
        // llama.cpp's cell bookkeeping is not safe to read while a decode changes it.
        await t.ctx.serialize(() => checkReadiness(t, this.options.seq, n));
      } catch (error) {
        // The public path imported everything at once: take it out again, keep the pages.
        if (t.backend.path === "public" && t.backend.kind !== "recurrent") {
          t.ctx.seqRm(this.options.seq);
        }
        throw error;
      }
    }
    for (const t of targets) t.pages.length = 0;
    this.#runs.clear();
    this.#stagedBytes = 0;
    this.#state = "validated";
  }

  /** Validates if needed, then hands the contexts back ready to decode. */
  async commit(): Promise<CommittedImport> {
    if (this.#state === "staging") await this.validate();
    if (this.#state !== "validated") {
      throw new StateValidationError(`Cannot commit: the import is ${this.#state}`);
    }
    for (const release of this.#releases) release();
    this.#releases = [];
    this.#state = "committed";
    return { mtpHidden: this.#hidden };
  }

  /** Wipes the sequence (and the draft's) and hands the contexts back empty. */
  async abort(): Promise<void> {
    if (this.#state === "committed" || this.#state === "aborted") return;
    this.#state = "aborted";
    for (const t of [this.#main, ...(this.#draft ? [this.#draft] : [])]) {
      t.pages.length = 0;
      await t.ctx.serialize(() => t.ctx.seqRm(this.options.seq));
    }
    for (const release of this.#releases) release();
    this.#releases = [];
  }
}
