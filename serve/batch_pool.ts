/**
 * The decode worker's shared context for continuous batching (serve/batch_loop.ts): one
 * llama.cpp context with `n_seq_max = sequencesMax`, whose sequences are handed to sessions.
 *
 * The KV cache is not unified: llama.cpp then gives each sequence its own stream of
 * `n_ctx / n_seq_max` cells (`n_ctx_seq`, padded to 256), numbered from 0 as in a context of
 * its own. So (1) taking a sequence reserves all its KV cells and its recurrent slot
 * (recurrent memory holds `n_seq_max` cells, one per sequence): an admitted request can never
 * run out of cells inside llama.cpp; and (2) handoff pages land at their source cell indices,
 * which keeps the attention summation order of the prefiller's single-sequence context (a
 * unified pool would place them elsewhere). The native shim imports into one stream; the
 * public state API cannot (its blob must carry every stream), so batching needs the shim.
 */
import { UsageError } from "../core/errors.ts";
import { LlamaContext, type LlamaModel } from "../ffi/mod.ts";
import { stateBackend } from "../ffi/state.ts";
import { BatchLoop, SequenceEngine } from "./batch_loop.ts";
import { type RuntimeConfig, UBATCH_TOKENS } from "./engine.ts";
import type { PooledSession, SessionPool } from "./pool.ts";

export interface BatchingOptions {
  /** Sequences of the shared context: sessions decoded together. */
  sequencesMax: number;
  /** Most tokens in one step (decode tokens plus prompt chunks); at least `sequencesMax`. */
  stepTokensMax: number;
}

export const BATCHING_DEFAULTS = { stepTokensMax: 512 } as const;

/** Upper bound on `sequencesMax` (llama.cpp's LLAMA_MAX_SEQ is 256). */
export const SEQUENCES_MAX = 256;

/** Sequence and cell usage of the shared context (counts only). */
export interface SequenceUsage {
  sequencesBusy: number;
  sequencesMax: number;
  /** Cells the busy sequences hold now (see `usage`), and all cells (sequences x cells each). */
  kvCellsUsed: number;
  kvCellsMax: number;
  /** Recurrent slots (one per sequence) in use; 0 for models without recurrent layers. */
  recurrentSlotsBusy: number;
  /** Sequences taken out of service because llama.cpp would not remove their state. */
  sequencesOutOfService: number;
}

export class SequencePool implements SessionPool, Disposable {
  readonly path = "batched";
  whenFree: (() => void) | null = null;
  /** Free sequence ids; the lowest is taken first, so running sequences stay consecutive. */
  readonly #free: number[];
  readonly #busy = new Map<number, SequenceEngine>();
  /** Released sequences still being wiped. */
  #wiping = 0;
  readonly #wipes = new Set<Promise<void>>();
  /** Sequences whose removal failed: out of service (reported in `usage`). */
  readonly #quarantined: number[] = [];

  private constructor(
    readonly model: LlamaModel,
    readonly config: Readonly<RuntimeConfig>,
    readonly loop: BatchLoop,
    readonly options: Readonly<BatchingOptions>,
    readonly recurrent: boolean,
  ) {
    this.#free = Array.from({ length: options.sequencesMax }, (_, i) => i);
  }

  /**
   * Creates the shared context on `model`: `config.nCtx` cells for each of
   * `options.sequencesMax` sequences. Throws UsageError when the shim is missing (see above).
   */
  static async open(
    model: LlamaModel,
    config: Readonly<RuntimeConfig>,
    options: BatchingOptions,
  ): Promise<SequencePool> {
    validateBatching(options, config.nCtx);
    const ctx = await LlamaContext.create(model, {
      nCtx: config.nCtx * options.sequencesMax,
      nBatch: Math.max(options.stepTokensMax, UBATCH_TOKENS),
      nUbatch: UBATCH_TOKENS,
      nSeqMax: options.sequencesMax,
      kvUnified: false,
      threads: config.threads,
      flashAttention: config.flashAttention,
      typeK: config.typeK,
      typeV: config.typeV,
      swaFull: config.swaFull ?? false,
      hugePages: config.hugePages,
    });
    try {
      const backend = await stateBackend(ctx);
      if (backend.path !== "shim" && options.sequencesMax > 1) {
        throw new UsageError(
          "Continuous batching needs the native shim: the public state API cannot import a " +
            "handoff into one sequence of a multi-sequence context",
          { hint: "build the shim (deno run -A ffi/shim/build.ts) or use --batching off" },
        );
      }
      if (ctx.nCtxSeq < config.nCtx) {
        throw new UsageError(
          `The shared context gives each sequence ${ctx.nCtxSeq} cells, fewer than --ctx ${config.nCtx}`,
        );
      }
      const loop = new BatchLoop(ctx, { stepTokensMax: options.stepTokensMax });
      return new SequencePool(
        model,
        config,
        loop,
        options,
        backend.kind === "hybrid" || backend.kind === "recurrent",
      );
    } catch (error) {
      ctx.free();
      throw error;
    }
  }

  get ctx(): LlamaContext {
    return this.loop.ctx;
  }

  get capacity(): number {
    return this.options.sequencesMax;
  }

  get busy(): number {
    return this.#busy.size + this.#wiping;
  }

  /** Tokens each sequence can hold. */
  get contextTokens(): number {
    return this.config.nCtx;
  }

  tryAcquire(): Promise<PooledSession | null> {
    const seq = this.#free.shift();
    if (seq === undefined) return Promise.resolve(null);
    const engine = new SequenceEngine(this.loop, this.model, this.config, seq, this.contextTokens);
    this.#busy.set(seq, engine);
    return Promise.resolve({ engine, draft: null });
  }

  /** Removes the sequence's cells and recurrent state, then makes it free again. */
  release(item: PooledSession): void {
    const engine = item.engine as SequenceEngine;
    if (this.#busy.get(engine.seq) !== engine) return; // released twice
    this.#busy.delete(engine.seq);
    this.#wiping++;
    const wipe = engine.wipe().then(() => true, () => false).then((wiped) => {
      this.#wiping--;
      this.#wipes.delete(wipe);
      // A sequence llama.cpp would not remove is never handed out again (the others keep
      // running; clearing the whole context would wipe them too).
      if (!wiped) return void this.#quarantined.push(engine.seq);
      // An idle context is zeroed as a whole (per-sequence removal leaves bytes unreachable,
      // overwritten on reuse, but not zeroed).
      if (this.busy === 0) this.ctx.clearMemory();
      this.#free.push(engine.seq);
      this.#free.sort((a, b) => a - b);
      this.whenFree?.();
    });
    this.#wipes.add(wipe);
  }

  /** Resolves once every sequence released so far is wiped and free again. */
  async drained(): Promise<void> {
    while (this.#wipes.size > 0) await Promise.allSettled([...this.#wipes]);
  }

  /**
   * Counts from this side's own bookkeeping, never from llama.cpp's cells (not safe to read
   * while a step decodes): a session holds the cells of the positions it has decoded or
   * committed; a staged import counts once committed.
   */
  usage(): SequenceUsage {
    let cells = 0;
    for (const engine of this.#busy.values()) cells += engine.position;
    return {
      sequencesBusy: this.busy,
      sequencesMax: this.options.sequencesMax,
      kvCellsUsed: cells,
      kvCellsMax: this.options.sequencesMax * this.contextTokens,
      recurrentSlotsBusy: this.recurrent ? this.busy : 0,
      sequencesOutOfService: this.#quarantined.length,
    };
  }

  [Symbol.dispose](): void {
    this.ctx.free();
  }
}

/** Throws UsageError naming the first out-of-range batching option. */
export function validateBatching(o: BatchingOptions, nCtx: number): void {
  if (!Number.isInteger(o.sequencesMax) || o.sequencesMax < 1 || o.sequencesMax > SEQUENCES_MAX) {
    throw new UsageError(
      `sequencesMax ${o.sequencesMax} is out of range: use 1 to ${SEQUENCES_MAX}`,
    );
  }
  if (!Number.isInteger(o.stepTokensMax) || o.stepTokensMax < o.sequencesMax) {
    throw new UsageError(
      `stepTokensMax ${o.stepTokensMax} must be an integer of at least sequencesMax (${o.sequencesMax})`,
      { hint: "every running stream needs its token in each step" },
    );
  }
  if (nCtx % 256 !== 0) {
    throw new UsageError(
      `With batching, --ctx must be a multiple of 256 (llama.cpp pads each sequence's cells to 256), got ${nCtx}`,
    );
  }
}
