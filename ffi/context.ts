/**
 * Safe wrapper for an inference context (`llama_context`): decode, logits, memory and state.
 *
 * Native calls on one context are serialized here (a context is not re-entrant), and every
 * compute call is nonblocking, so other work (sending state pages) proceeds meanwhile.
 */
import { adviseNewMappings, type HugePageAdvice } from "./huge_pages.ts";
import {
  assert,
  ModelLoadError,
  RuntimeLibraryError,
  StateValidationError,
  UsageError,
} from "../core/errors.ts";
import type { LlamaBatch } from "./batch.ts";
import {
  ggml_threadpool_params,
  GGML_TYPE,
  type KvType,
  llama_context_params,
  LLAMA_CONTEXT_TYPE,
  LLAMA_FLASH_ATTN_TYPE,
  llama_perf_context_data,
} from "./llama.ts";
import type { LlamaModel } from "./model.ts";

/**
 * Everything about a context that changes numerics is an explicit option with a fixed default
 * (see `NUMERIC_DEFAULTS`): thread count, flash attention and K/V types.
 */
export interface ContextOptions {
  /** Context size in tokens. */
  nCtx: number;
  /** Largest prompt chunk passed to one decode call. */
  nBatch: number;
  /** Physical micro-batch (default min(nBatch, 512)). */
  nUbatch?: number;
  threads: number;
  flashAttention: boolean;
  typeK: KvType;
  typeV: KvType;
  /** Sequences the context can hold (default 1). */
  nSeqMax?: number;
  /** One KV buffer shared by all sequences (default true). */
  kvUnified?: boolean;
  /** Recurrent-state snapshots per sequence for rollback (default 0). */
  nRsSeq?: number;
  /**
   * ISWA models: a full-size sliding-window cache (llama.cpp's default, true) or a ring of
   * about n_swa + n_ubatch cells (false). A handoff sends the whole sliding-window cache last,
   * so false keeps that snapshot bounded. Part of the numerical identity.
   */
  swaFull?: boolean;
  /** Create an MTP draft context (the model must be loaded with `loadMtp`). */
  mtp?: boolean;
  /**
   * Thread-pool polling level, 0 (sleep between graphs) to 100 (spin). Does not change
   * numerics; default 0 so that co-located workers do not burn each other's cores.
   */
  pollLevel?: number;
  /**
   * Ask Linux for transparent huge pages on the buffers this context allocates (default true;
   * see `huge_pages.ts`). Placement only: numerics are unchanged.
   */
  hugePages?: boolean;
}

/** The numerics defaults: fixed, never derived from the machine. */
export const NUMERIC_DEFAULTS = {
  threads: 2,
  flashAttention: false,
  typeK: "f16" as KvType,
  typeV: "f16" as KvType,
} as const;

const DECODE_ERRORS: Record<number, string> = {
  1: "no room left in the context (KV cache full)",
  2: "decode was aborted",
  [-1]: "invalid input batch",
};

export class LlamaContext implements Disposable {
  #ptr: Deno.PointerValue;
  #threadpool: Deno.PointerValue = null;
  readonly #beforeFree = new Set<() => void>();
  #queue: Promise<unknown> = Promise.resolve();
  #heldBy: string | null = null;
  /** Sequences held by an uncommitted import while the rest of the context decodes. */
  readonly #heldSeqs = new Map<number, string>();
  readonly nCtx: number;
  readonly nVocab: number;
  readonly nEmbd: number;
  /** What was asked of the kernel for this context's buffers (see `huge_pages.ts`). */
  hugePages: HugePageAdvice = { advisedBytes: 0, collapsedBytes: 0, reason: "not asked" };

  private constructor(
    readonly model: LlamaModel,
    ptr: Deno.PointerObject,
    readonly options: Readonly<ContextOptions>,
  ) {
    this.#ptr = ptr;
    this.nCtx = model.lib.symbols.llama_n_ctx(ptr);
    this.nVocab = model.vocab.nTokens;
    this.nEmbd = model.lib.symbols.llama_model_n_embd(model.ptr);
  }

  static async create(model: LlamaModel, options: ContextOptions): Promise<LlamaContext> {
    const lib = model.lib;
    const nCtxTrain = lib.symbols.llama_model_n_ctx_train(model.ptr);
    if (!Number.isInteger(options.nCtx) || options.nCtx < 1) {
      throw new UsageError(`Context size ${options.nCtx} is not a positive integer`);
    }
    if (nCtxTrain > 0 && options.nCtx > nCtxTrain) {
      throw new UsageError(
        `Context of ${options.nCtx} tokens exceeds the model's training context of ${nCtxTrain}`,
        { hint: `use --ctx ${nCtxTrain} or less` },
      );
    }
    if (options.mtp && !model.loadMtp) {
      // Creating an MTP context on a model loaded without MTP aborts the process in llama.cpp.
      throw new UsageError("An MTP draft context needs the model loaded with MTP layers", {
        hint: "load the model with loadMtp (CLI: --mtp)",
      });
    }
    const p = lib.symbols.llama_context_default_params();
    const set = llama_context_params.set.bind(llama_context_params, p);
    set("n_ctx", options.nCtx);
    set("n_batch", options.nBatch);
    set("n_ubatch", options.nUbatch ?? Math.min(options.nBatch, 512));
    set("n_seq_max", options.nSeqMax ?? 1);
    set("n_rs_seq", options.nRsSeq ?? 0);
    set("n_threads", options.threads);
    set("n_threads_batch", options.threads);
    set("ctx_type", options.mtp ? LLAMA_CONTEXT_TYPE.MTP : LLAMA_CONTEXT_TYPE.DEFAULT);
    set(
      "flash_attn_type",
      options.flashAttention ? LLAMA_FLASH_ATTN_TYPE.ENABLED : LLAMA_FLASH_ATTN_TYPE.DISABLED,
    );
    set("type_k", GGML_TYPE[options.typeK]);
    set("type_v", GGML_TYPE[options.typeV]);
    set("kv_unified", options.kvUnified ?? true);
    set("swa_full", options.swaFull ?? true);
    set("no_perf", false);
    lib.log.clear();
    const advise = adviseNewMappings(options.hugePages !== false);
    const ptr = await lib.symbols.llama_init_from_model(model.ptr, p);
    if (ptr === null) {
      const reason = lib.log.recent().at(-1) ?? "no reason given";
      throw new ModelLoadError(`llama.cpp could not create a context: ${reason}`, {
        hint: "try a smaller --ctx, or other --kv-type / --flash-attn settings",
      });
    }
    const ctx = new LlamaContext(model, ptr, { ...options });
    ctx.hugePages = await advise();
    ctx.#attachThreadpool();
    return ctx;
  }

  /**
   * Without a persistent pool, ggml builds and tears down a thread pool on every graph, which
   * costs milliseconds per decoded token (measured: 13 ms vs 0.2 ms per token on a tiny model
   * with 2 threads). The pool has the same thread count, so numerics are unchanged.
   */
  #attachThreadpool(): void {
    const lib = this.model.lib;
    const params = new Uint8Array(ggml_threadpool_params.size);
    const view = new DataView(params.buffer);
    view.setInt32(ggml_threadpool_params.offsets.n_threads, this.options.threads, true);
    view.setUint32(ggml_threadpool_params.offsets.poll, this.options.pollLevel ?? 0, true);
    const pool = lib.ggmlCpu.ggml_threadpool_new(params);
    if (pool === null) return; // decode still works with per-graph pools, only slower
    lib.symbols.llama_attach_threadpool(this.ptr, pool, pool);
    this.#threadpool = pool;
  }

  get ptr(): Deno.PointerObject {
    if (this.#ptr === null) throw new Error("Internal error: context used after free");
    return this.#ptr;
  }

  /** Runs `fn` after every earlier native call on this context has finished. */
  serialize<T>(fn: () => Promise<T> | T): Promise<T> {
    const run = this.#queue.then(fn, fn);
    this.#queue = run.catch(() => {});
    return run;
  }

  /**
   * Marks the context as owned by an uncommitted state import: `decode` throws until the
   * returned release function runs. llama.cpp decodes partial state without complaint, so
   * this is what keeps a half-imported session from generating.
   */
  hold(holder: string): () => void {
    assert(this.#heldBy === null, `context already held by ${this.#heldBy}`);
    this.#heldBy = holder;
    return () => {
      this.#heldBy = null;
    };
  }

  /**
   * Like `hold`, for one sequence of a context that several sessions share: a batch that
   * names `seq` is refused until the release runs; other sequences keep decoding.
   */
  holdSequence(seq: number, holder: string): () => void {
    assert(this.#heldBy === null, `context already held by ${this.#heldBy}`);
    assert(!this.#heldSeqs.has(seq), `sequence ${seq} already held by ${this.#heldSeqs.get(seq)}`);
    this.#heldSeqs.set(seq, holder);
    return () => {
      this.#heldSeqs.delete(seq);
    };
  }

  /** Who holds sequence `seq` (see `holdSequence`), or null. */
  sequenceHeldBy(seq: number): string | null {
    return this.#heldSeqs.get(seq) ?? null;
  }

  /** Sequences this context holds (`n_seq_max`). */
  get nSeqMax(): number {
    return this.model.lib.symbols.llama_n_seq_max(this.ptr);
  }

  /** Cells each sequence may use: `n_ctx`, or `n_ctx / n_seq_max` without a unified cache. */
  get nCtxSeq(): number {
    return this.model.lib.symbols.llama_n_ctx_seq(this.ptr);
  }

  /** Who holds the context (see `hold`), or null. */
  get heldBy(): string | null {
    return this.#heldBy;
  }

  /** Decodes a batch; throws RuntimeLibraryError with llama.cpp's reason on failure. */
  decode(batch: LlamaBatch): Promise<void> {
    return this.#decode(batch, () => {});
  }

  #decode(batch: LlamaBatch, after: () => void): Promise<void> {
    if (this.#heldBy !== null) {
      return Promise.reject(
        new StateValidationError(`Cannot decode: the context holds ${this.#heldBy}`, {
          hint: "commit the state import first (or abort it)",
        }),
      );
    }
    for (let i = 0; this.#heldSeqs.size > 0 && i < batch.length; i++) {
      const holder = this.#heldSeqs.get(batch.seqIdAt(i));
      if (holder !== undefined) {
        return Promise.reject(
          new StateValidationError(
            `Cannot decode sequence ${batch.seqIdAt(i)}: it holds ${holder}`,
            {
              hint: "commit the state import first (or abort it)",
            },
          ),
        );
      }
    }
    return this.serialize(async () => {
      const lib = this.model.lib;
      lib.log.clear();
      const rc = await lib.symbols.llama_decode(this.ptr, batch.struct());
      if (rc !== 0) {
        const what = DECODE_ERRORS[rc] ?? `error code ${rc}`;
        const detail = lib.log.recent().at(-1);
        throw new RuntimeLibraryError(
          `llama_decode failed: ${what}${detail ? ` (llama.cpp: ${detail})` : ""}`,
        );
      }
      after();
    });
  }

  /**
   * Decodes a batch and copies the logits of the batch indices `rows` (tokens that asked for
   * output) before any other native call on this context can run: a context shared by several
   * sessions hands each one its own row.
   */
  async decodeRows(batch: LlamaBatch, rows: readonly number[]): Promise<Float32Array[]> {
    let out: Float32Array[] = [];
    await this.#decode(batch, () => {
      out = rows.map((i) => this.logits(i));
    });
    return out;
  }

  /** A copy of the logits of output row `i` (-1 = last). */
  logits(i = -1): Float32Array {
    const ptr = this.model.lib.symbols.llama_get_logits_ith(this.ptr, i);
    if (ptr === null) throw new RuntimeLibraryError(`No logits for output row ${i}`);
    return copyFloats(ptr, this.nVocab);
  }

  /** Nextn (MTP) embedding row `i` after a decode with nextn embeddings enabled. */
  nextnEmbedding(i: number): Float32Array {
    const ptr = this.model.lib.symbols.llama_get_embeddings_nextn_ith(this.ptr, i);
    if (ptr === null) throw new RuntimeLibraryError(`No nextn embedding for row ${i}`);
    return copyFloats(ptr, this.nEmbd);
  }

  setEmbeddingsNextn(value: boolean, masked: boolean): void {
    this.model.lib.symbols.llama_set_embeddings_nextn(this.ptr, value, masked);
  }

  get memory(): Deno.PointerObject {
    return this.model.lib.symbols.llama_get_memory(this.ptr)!;
  }

  seqPosMax(seq = 0): number {
    return this.model.lib.symbols.llama_memory_seq_pos_max(this.memory, seq);
  }

  seqPosMin(seq = 0): number {
    return this.model.lib.symbols.llama_memory_seq_pos_min(this.memory, seq);
  }

  /** Removes positions [p0, p1) of `seq` (-1 = open end). */
  seqRm(seq: number, p0 = -1, p1 = -1): boolean {
    return this.model.lib.symbols.llama_memory_seq_rm(this.memory, seq, p0, p1);
  }

  clearMemory(): void {
    this.model.lib.symbols.llama_memory_clear(this.memory, true);
  }

  synchronize(): void {
    this.model.lib.symbols.llama_synchronize(this.ptr);
  }

  /** Bytes of the sequence state (`flags` 1 = partial only: recurrent / SWA part). */
  stateSeqSize(seq = 0, flags = 0): number {
    return Number(this.model.lib.symbols.llama_state_seq_get_size_ext(this.ptr, seq, flags));
  }

  /** Exports the sequence state; asserts the bytes written equal the size reported. */
  stateSeqGet(seq = 0, flags = 0): Promise<Uint8Array<ArrayBuffer>> {
    return this.serialize(async () => {
      const size = this.stateSeqSize(seq, flags);
      const buf = new Uint8Array(size);
      const n = Number(
        await this.model.lib.symbols.llama_state_seq_get_data_ext(
          this.ptr,
          buf,
          BigInt(size),
          seq,
          flags,
        ),
      );
      if (n !== size) {
        throw new RuntimeLibraryError(`State export wrote ${n} bytes, expected ${size}`);
      }
      return buf;
    });
  }

  /** Imports a sequence state blob; throws with llama.cpp's reason when it is refused. */
  stateSeqSet(data: Uint8Array<ArrayBuffer>, seq = 0, flags = 0): Promise<void> {
    return this.serialize(async () => {
      const lib = this.model.lib;
      lib.log.clear();
      const n = Number(
        await lib.symbols.llama_state_seq_set_data_ext(
          this.ptr,
          data,
          BigInt(data.byteLength),
          seq,
          flags,
        ),
      );
      if (n !== data.byteLength) {
        const detail = lib.log.recent().at(-1) ?? "no reason given";
        throw new RuntimeLibraryError(`llama.cpp refused the state import: ${detail}`);
      }
    });
  }

  /** llama.cpp's own timing counters (prompt and generation evaluation). */
  perf(): { promptMs: number; promptTokens: number; evalMs: number; evalTokens: number } {
    const data = this.model.lib.symbols.llama_perf_context(this.ptr);
    const get = (name: Parameters<typeof llama_perf_context_data.get>[1]) =>
      Number(llama_perf_context_data.get(data, name));
    return {
      promptMs: get("t_p_eval_ms"),
      promptTokens: get("n_p_eval"),
      evalMs: get("t_eval_ms"),
      evalTokens: get("n_eval"),
    };
  }

  resetPerf(): void {
    this.model.lib.symbols.llama_perf_context_reset(this.ptr);
  }

  /**
   * Runs `release` just before the context is freed: what lives on the context (a layer
   * capture's eval callback and rows) goes first, so a context later allocated at the same
   * address starts clean. Returns what cancels it.
   */
  beforeFree(release: () => void): () => void {
    this.#beforeFree.add(release);
    return () => void this.#beforeFree.delete(release);
  }

  free(): void {
    if (this.#ptr !== null) {
      for (const release of [...this.#beforeFree]) release();
      this.#beforeFree.clear();
      const lib = this.model.lib;
      if (this.#threadpool !== null) lib.symbols.llama_detach_threadpool(this.#ptr);
      lib.symbols.llama_free(this.#ptr);
      this.#ptr = null;
    }
    if (this.#threadpool !== null) {
      this.model.lib.ggmlCpu.ggml_threadpool_free(this.#threadpool);
      this.#threadpool = null;
    }
  }

  [Symbol.dispose](): void {
    this.free();
  }
}

function copyFloats(ptr: Deno.PointerObject, n: number): Float32Array {
  return new Float32Array(Deno.UnsafePointerView.getArrayBuffer(ptr, n * 4).slice(0));
}
