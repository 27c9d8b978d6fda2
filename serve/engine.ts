/**
 * The local engine: one model and one context, chunked prefill and token-by-token decode.
 * This is the colocated baseline that every disaggregated run is compared with, and the
 * building block the prefill and decode workers drive.
 */
import { UsageError } from "../core/errors.ts";
import { nRsSeqFor, type SpeculationConfig } from "./speculative.ts";
import { type SamplerState, sampleToken, type SamplingParams } from "../core/sampling.ts";
import {
  type GpuLayersRequest,
  type KvType,
  LlamaBatch,
  LlamaContext,
  type LlamaLibrary,
  LlamaModel,
  loadLlama,
  NUMERIC_DEFAULTS,
} from "../ffi/mod.ts";

/** Everything that decides numerics or capacity of a worker's runtime. */
export interface RuntimeConfig {
  modelPath: string;
  /** Context size in tokens. */
  nCtx: number;
  /** Prompt tokens per prefill chunk (one llama_decode call each). */
  chunkTokens: number;
  threads: number;
  flashAttention: boolean;
  typeK: KvType;
  typeV: KvType;
  /** CPU backend variant; default: best for this machine. */
  cpuVariant?: string;
  /** Layers offloaded to the GPU: a count, "all", or "auto" (default: all when there is one). */
  gpuLayers?: GpuLayersRequest;
  /** Load the MTP layers (hybrid-moe-mtp models). */
  mtp?: boolean;
  /**
   * Ask Linux for transparent huge pages on the weights (read into memory, not mapped) and the
   * contexts' buffers (default true; placement only, numerics unchanged: ffi/huge_pages.ts).
   */
  hugePages?: boolean;
  /**
   * Size the sliding-window cache of ISWA models to the whole context (default false: the
   * window plus one micro-batch, which keeps the handoff's SWA snapshot bounded).
   */
  swaFull?: boolean;
  /**
   * Recurrent-state snapshots per sequence (`n_rs_seq`), for rolling back rejected
   * speculative positions natively (default 0; llama.cpp clamps it to 0 for architectures
   * without native rollback). See serve/speculative.ts.
   */
  nRsSeq?: number;
  /**
   * Speculative decoding on this worker's per-session contexts (default none). When set and
   * `nRsSeq` is not, contexts keep `draftTokensMax` recurrent snapshots.
   */
  speculation?: SpeculationConfig;
}

export const RUNTIME_DEFAULTS = {
  nCtx: 8192,
  chunkTokens: 512,
  ...NUMERIC_DEFAULTS,
} as const;

/** Upper bound on prompt chunk size: one decode call's batch. */
export const CHUNK_TOKENS_MAX = 8192;
/**
 * Physical micro-batch, fixed whatever the chunk size: it sizes the sliding-window ring of
 * ISWA models, so it is part of the numerical identity.
 */
export const UBATCH_TOKENS = 512;

/** Hooks into `prefill`. */
export interface PrefillHooks {
  /**
   * Runs the last chunk's decode (`decode()`, which must be called exactly once) and may work
   * beside it: the prefill worker captures each recurrent layer's final rows while later layers
   * still compute. The last chunk holds positions [`p0`, `finalPos`]; `finalPos` is the
   * prompt's last position. With this hook the prompt's remainder is prefilled first, so the
   * last chunk is full (chunking does not change the numerics of the families that have
   * recurrent layers: tested bitwise).
   */
  lastDecode?: (decode: () => Promise<void>, finalPos: number, p0: number) => Promise<void>;
}

/** Per-chunk progress report from `prefill`. */
export interface ChunkDone {
  /** Token positions [p0, p1) just computed. */
  p0: number;
  p1: number;
  /** Milliseconds the chunk's decode took. */
  computeMs: number;
}

/**
 * What the decode side needs of an engine, whichever path serves it: an `Engine` (one context
 * per session) or a `SequenceEngine` (one sequence of the decode worker's shared context,
 * serve/batch_loop.ts). Everything here acts on the session's own sequence only.
 */
export interface DecodeEngine {
  readonly model: LlamaModel;
  readonly ctx: LlamaContext;
  readonly config: Readonly<RuntimeConfig>;
  /** The session's sequence in `ctx`. */
  readonly seq: number;
  /** Tokens the session's sequence can hold. */
  readonly contextTokens: number;
  /** Which path serves the session (telemetry). */
  readonly path: "per-session" | "batched";
  readonly position: number;
  adoptPosition(pos: number): void;
  /**
   * Whether every decode of the session runs alone (no other sequence in the step): always on a
   * context of its own; settable on a shared one (serve/batch_loop.ts), where batched decode
   * logits may differ from a lone run's in the last bits.
   */
  alone: boolean;
  prefill(tokens: Int32Array): Promise<Float32Array>;
  /** Decodes one token; `alone` keeps this step alone even on a shared context (the probe). */
  step(token: number, alone?: boolean): Promise<Float32Array>;
  generate(
    logits: Float32Array,
    n: number,
    sampling: SamplingParams,
    sampler: SamplerState,
  ): AsyncGenerator<{ token: number; logits: Float32Array }>;
  /** Removes the session's state (and, where the context is its own, zeroes it). */
  wipe(): Promise<void>;
}

/**
 * Samples from `logits`, then decodes each sampled token with `step` to get the next logits,
 * `n` times; yields every token with the logits it was sampled from. Stops after an
 * end-of-generation token.
 */
export async function* sampleAndStep(
  engine: Pick<DecodeEngine, "model" | "step">,
  logits: Float32Array,
  n: number,
  sampling: SamplingParams,
  sampler: SamplerState,
): AsyncGenerator<{ token: number; logits: Float32Array }> {
  let current = logits;
  for (let i = 0; i < n; i++) {
    const token = sampleToken(current, sampling, sampler);
    yield { token, logits: current };
    if (engine.model.vocab.isEog(token) || i === n - 1) return;
    current = await engine.step(token);
  }
}

export class Engine implements Disposable, DecodeEngine {
  readonly batch: LlamaBatch;
  readonly seq = 0;
  readonly path = "per-session";
  /** A context of its own: always alone. */
  get alone(): boolean {
    return true;
  }
  set alone(_: boolean) {}
  #pos = 0;

  private constructor(
    readonly lib: LlamaLibrary,
    readonly model: LlamaModel,
    readonly ctx: LlamaContext,
    readonly config: Readonly<RuntimeConfig>,
  ) {
    this.batch = new LlamaBatch(config.chunkTokens);
  }

  /** Loads the model and creates a context; `model` may be shared between engines. */
  static async open(config: RuntimeConfig, shared?: LlamaModel): Promise<Engine> {
    validateConfig(config);
    const lib = loadLlama({ cpuVariant: config.cpuVariant });
    const model = shared ?? await LlamaModel.load(lib, config.modelPath, {
      loadMtp: config.mtp,
      gpuLayers: config.gpuLayers,
      hugePages: config.hugePages !== false,
    });
    const ctx = await LlamaContext.create(model, {
      nCtx: config.nCtx,
      nBatch: Math.max(config.chunkTokens, UBATCH_TOKENS),
      nUbatch: UBATCH_TOKENS,
      threads: config.threads,
      flashAttention: config.flashAttention,
      typeK: config.typeK,
      typeV: config.typeV,
      swaFull: config.swaFull ?? false,
      nRsSeq: config.nRsSeq ?? (config.speculation ? nRsSeqFor(config.speculation) : 0),
      hugePages: config.hugePages,
    });
    const engine = new Engine(lib, model, ctx, config);
    engine.#ownsModel = shared === undefined;
    return engine;
  }

  #ownsModel = false;

  get contextTokens(): number {
    return this.ctx.nCtx;
  }

  /** Zeroes the context's memory (it serves one session). */
  wipe(): Promise<void> {
    return this.ctx.serialize(() => {
      this.ctx.clearMemory();
      this.#pos = 0;
    });
  }

  /** Next position to be written (tokens held by the context). */
  get position(): number {
    return this.#pos;
  }

  /** Sets the position after state was imported from elsewhere. */
  adoptPosition(pos: number): void {
    this.#pos = pos;
  }

  /**
   * Prefills `tokens` in chunks of `config.chunkTokens`; calls `onChunk` after each chunk (the
   * prefill worker exports and sends that chunk's KV page there). Returns the last logits.
   */
  async prefill(
    tokens: Int32Array,
    onChunk?: (chunk: ChunkDone) => Promise<void> | void,
    options: PrefillHooks = {},
  ): Promise<Float32Array> {
    if (tokens.length === 0) throw new UsageError("The prompt is empty");
    const needed = this.#pos + tokens.length;
    if (needed > this.ctx.nCtx) {
      throw new UsageError(
        `Prompt of ${tokens.length} tokens does not fit the context of ${this.ctx.nCtx} tokens`,
        { hint: `use --ctx ${Math.ceil(needed / 256) * 256 + 256} or a shorter prompt` },
      );
    }
    const chunk = this.config.chunkTokens;
    // With a last-decode hook the remainder goes first, so the last chunk is a full one: its
    // compute is what the hook's work (sending recurrent layers) hides behind.
    const head = options.lastDecode ? tokens.length % chunk : 0;
    for (let i = 0; i < tokens.length; i = i === 0 && head > 0 ? head : i + chunk) {
      const end = Math.min(i === 0 && head > 0 ? head : i + chunk, tokens.length);
      const part = tokens.subarray(i, end);
      const p0 = this.#pos;
      const last = end === tokens.length;
      this.batch.fill(part, p0, last);
      const t0 = performance.now();
      const decode = () => this.ctx.decode(this.batch);
      if (last && options.lastDecode) await options.lastDecode(decode, p0 + part.length - 1, p0);
      else await decode();
      this.#pos += part.length;
      await onChunk?.({ p0, p1: this.#pos, computeMs: performance.now() - t0 });
    }
    return this.ctx.logits(-1);
  }

  /** Decodes one token at the current position and returns its logits. */
  async step(token: number): Promise<Float32Array> {
    if (this.#pos >= this.ctx.nCtx) {
      throw new UsageError(`The context of ${this.ctx.nCtx} tokens is full`, {
        hint: "use a larger --ctx or generate fewer tokens",
      });
    }
    this.batch.fill([token], this.#pos, true);
    await this.ctx.decode(this.batch);
    this.#pos += 1;
    return this.ctx.logits(-1);
  }

  /**
   * Samples from `logits`, then decodes each sampled token to get the next logits, `n` times.
   * Yields every token together with the logits it was sampled from.
   */
  async *generate(
    logits: Float32Array,
    n: number,
    sampling: SamplingParams,
    sampler: SamplerState,
  ): AsyncGenerator<{ token: number; logits: Float32Array }> {
    yield* sampleAndStep(this, logits, n, sampling, sampler);
  }

  [Symbol.dispose](): void {
    this.ctx.free();
    if (this.#ownsModel) this.model.free();
  }
}

function validateConfig(c: RuntimeConfig): void {
  if (!Number.isInteger(c.chunkTokens) || c.chunkTokens < 1 || c.chunkTokens > CHUNK_TOKENS_MAX) {
    throw new UsageError(
      `Chunk size ${c.chunkTokens} is out of range: use 1 to ${CHUNK_TOKENS_MAX} tokens`,
    );
  }
  if (!Number.isInteger(c.threads) || c.threads < 1 || c.threads > 256) {
    throw new UsageError(`Thread count ${c.threads} is out of range: use 1 to 256`);
  }
}
