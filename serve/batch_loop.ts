/**
 * Continuous batching on the decode worker: one llama.cpp context whose sequences are the
 * running sessions, and an iteration-level loop. Each step gathers one token of every session
 * waiting for its next logits (a decode token) plus chunks of colocated prompts under a
 * per-step token budget (`stepTokensMax`, chunked prefill), runs one `llama_decode`, and hands
 * each session the logits row of its own last token. Sampling stays in TypeScript
 * (core/sampling.ts) in each session, so every sampler state stays a small exportable value.
 *
 * Sessions join and leave between steps: a session submits work when it has some, and the
 * loop runs while any is pending. After a step the loop waits for the sessions that just got
 * their logits to sample and submit their next token (microtasks), at most one macrotask, so
 * they share the next step.
 * Nothing else decodes the context: every decode goes through this loop, serialized with the
 * staged imports (ffi/context.ts `serialize`) that land handoffs in free sequences between
 * steps.
 */
import { UsageError } from "../core/errors.ts";
import type { SamplerState, SamplingParams } from "../core/sampling.ts";
import { LlamaBatch, type LlamaContext, type LlamaModel } from "../ffi/mod.ts";
import { type DecodeEngine, type RuntimeConfig, sampleAndStep } from "./engine.ts";

export interface BatchLoopOptions {
  /**
   * Most tokens one step's `llama_decode` carries (tokens): one per running stream, the rest
   * for prompt chunks. At least the number of sequences, so every stream fits in each step.
   */
  stepTokensMax: number;
}

/** What the loop has done since start (counts only). */
export interface BatchLoopTotals {
  steps: number;
  /** Decode tokens (one per stream per step) and prompt tokens, summed over steps. */
  decodeTokens: number;
  promptTokens: number;
  /** Most sequences seen in one step. */
  sequencesPerStepMax: number;
  /** Steps that held one alone work (see `submit`). */
  aloneSteps: number;
}

interface Work {
  seq: number;
  tokens: Int32Array;
  /** Position of `tokens[0]`. */
  pos0: number;
  /** Tokens already decoded. */
  done: number;
  /** Decoded in steps of its own (the exactness gates: see `submit`). */
  alone: boolean;
  resolve: (logits: Float32Array) => void;
  reject: (error: Error) => void;
}

/** One sequence's part of a step. */
interface Part {
  work: Work;
  take: number;
  /** Batch index of its last token when that one's logits are wanted, else -1. */
  row: number;
}

export class BatchLoop {
  /** Single tokens waiting for their step (one per stream). */
  readonly #decodes: Work[] = [];
  /** Prompts being prefilled in chunks, oldest first. */
  readonly #prompts: Work[] = [];
  /** Work decoded in steps of its own, oldest first. */
  readonly #alone: Work[] = [];
  /** Whether the last step was an alone one (alone and shared steps alternate). */
  #lastAlone = false;
  readonly #batch: LlamaBatch;
  #running = false;
  /** Submits since the last step handed out its logits (see `#gather`). */
  #resubmits = 0;
  #gathered: { target: number; wake: () => void } | null = null;
  readonly totals: BatchLoopTotals = {
    steps: 0,
    decodeTokens: 0,
    promptTokens: 0,
    sequencesPerStepMax: 0,
    aloneSteps: 0,
  };

  constructor(readonly ctx: LlamaContext, readonly options: Readonly<BatchLoopOptions>) {
    this.#batch = new LlamaBatch(options.stepTokensMax);
  }

  /**
   * Decodes `tokens` of sequence `seq` at positions `pos0...` (a prompt is split over steps
   * under the budget) and resolves with the logits after the last one.
   *
   * `alone`: decode it in steps that hold no other sequence. A sequence decoded alone in the
   * shared context gives logits bitwise equal to a context of its own (measured); batched with
   * others, decode logits differ in the last bits (see serve/README.md). The continuation probe
   * and requests that ask for per-token logits digests use it.
   */
  submit(seq: number, tokens: Int32Array, pos0: number, alone = false): Promise<Float32Array> {
    if (tokens.length === 0) return Promise.reject(new UsageError("Nothing to decode"));
    const busy = [...this.#decodes, ...this.#prompts, ...this.#alone].some((w) => w.seq === seq);
    if (busy) {
      return Promise.reject(new Error(`Internal error: sequence ${seq} already has work queued`));
    }
    return new Promise((resolve, reject) => {
      const work = { seq, tokens, pos0, done: 0, alone, resolve, reject };
      (alone ? this.#alone : tokens.length === 1 ? this.#decodes : this.#prompts).push(work);
      this.#resubmits++;
      if (this.#gathered && this.#resubmits >= this.#gathered.target) this.#gathered.wake();
      this.#kick();
    });
  }

  /** Drops the queued work of `seq` (its session left); a step already running finishes. */
  cancel(seq: number, why: string): void {
    for (const list of [this.#decodes, this.#prompts, this.#alone]) {
      for (let i = list.length - 1; i >= 0; i--) {
        if (list[i].seq !== seq) continue;
        list.splice(i, 1)[0].reject(new UsageError(`Decode of sequence ${seq} cancelled: ${why}`));
      }
    }
  }

  /** Sequences with work queued now. */
  get pending(): number {
    return this.#decodes.length + this.#prompts.length + this.#alone.length;
  }

  #kick(): void {
    if (this.#running) return;
    this.#running = true;
    // A macrotask: every session resolved by the same event gets to submit first.
    setTimeout(() => this.#run(), 0);
  }

  async #run(): Promise<void> {
    try {
      while (this.pending > 0) await this.#gather(await this.#step());
    } finally {
      this.#running = false;
    }
  }

  /**
   * Waits until the `resolved` sessions of the last step have submitted their next work (they
   * sample in microtasks, so usually at once), or one macrotask has passed (a session busy
   * sending, or one that ended): it joins a later step.
   */
  #gather(resolved: number): Promise<void> {
    if (resolved === 0 || this.#resubmits >= resolved) return Promise.resolve();
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#gathered = null;
        resolve();
      };
      const timer = setTimeout(wake, 0);
      this.#gathered = { target: resolved, wake };
    });
  }

  /**
   * Composes one step and runs it (returns how many works it resolved): every decode token, then prompt chunks under the budget;
   * or, alternating with those, one alone work's next chunk.
   */
  async #step(): Promise<number> {
    const shared = this.#decodes.length + this.#prompts.length > 0;
    const alone = this.#alone.length > 0 && (!shared || !this.#lastAlone);
    this.#lastAlone = alone;
    const parts: Part[] = alone
      ? []
      : this.#decodes.splice(0).map((work) => ({ work, take: 1, row: -1 }));
    let budget = this.options.stepTokensMax - parts.length;
    for (const work of alone ? this.#alone.slice(0, 1) : this.#prompts) {
      if (budget <= 0) break;
      const take = Math.min(work.tokens.length - work.done, budget);
      parts.push({ work, take, row: -1 });
      budget -= take;
    }
    // Ascending sequence ids: without a unified cache llama.cpp puts only consecutive
    // sequences in one micro-batch.
    parts.sort((a, b) => a.work.seq - b.work.seq);
    const batch = this.#batch;
    batch.clear();
    const rows: number[] = [];
    for (const part of parts) {
      const { work, take } = part;
      const last = work.done + take === work.tokens.length;
      for (let i = 0; i < take; i++) {
        const k = work.done + i;
        batch.add(work.tokens[k], work.pos0 + k, last && i === take - 1, work.seq);
      }
      if (last) {
        part.row = batch.length - 1;
        rows.push(part.row);
      }
    }
    let logits: Float32Array[];
    try {
      logits = await this.ctx.decodeRows(batch, rows);
    } catch (error) {
      for (const part of parts) this.#drop(part.work, error as Error);
      return 0;
    }
    this.totals.steps++;
    this.totals.sequencesPerStepMax = Math.max(this.totals.sequencesPerStepMax, parts.length);
    let r = 0;
    this.#resubmits = 0;
    for (const part of parts) {
      const { work, take } = part;
      if (work.tokens.length === 1) this.totals.decodeTokens++;
      if (alone) this.totals.aloneSteps++;
      else this.totals.promptTokens += take;
      work.done += take;
      if (part.row < 0) continue;
      this.#drop(work, null);
      work.resolve(logits[r++]);
    }
    return r;
  }

  /** Removes `work` from its queue; rejects it with `error` when given. */
  #drop(work: Work, error: Error | null): void {
    const list = work.alone ? this.#alone : this.#prompts;
    const at = list.indexOf(work);
    if (at >= 0) list.splice(at, 1);
    if (error) work.reject(error);
  }
}

/**
 * One session's view of the shared context: its own sequence, position and capacity; every
 * decode goes through the batch loop. Implements the decode side's engine interface, so a
 * committed handoff or a colocated request runs on it exactly as on a context of its own.
 */
export class SequenceEngine implements DecodeEngine {
  readonly path = "batched";
  /** Decode every step of this session alone (bitwise equal to a context of its own). */
  alone = false;
  #pos = 0;

  constructor(
    readonly loop: BatchLoop,
    readonly model: LlamaModel,
    readonly config: Readonly<RuntimeConfig>,
    readonly seq: number,
    readonly contextTokens: number,
  ) {}

  get ctx(): LlamaContext {
    return this.loop.ctx;
  }

  get position(): number {
    return this.#pos;
  }

  adoptPosition(pos: number): void {
    this.#pos = pos;
  }

  /** Prefills the whole prompt (chunked by the loop's budget); returns the last logits. */
  async prefill(tokens: Int32Array): Promise<Float32Array> {
    if (tokens.length === 0) throw new UsageError("The prompt is empty");
    this.#mustFit(tokens.length);
    const logits = await this.loop.submit(this.seq, tokens, this.#pos, this.alone);
    this.#pos += tokens.length;
    return logits;
  }

  /** Decodes one token; `alone` for this step only (the continuation probe). */
  async step(token: number, alone = false): Promise<Float32Array> {
    this.#mustFit(1);
    const once = alone || this.alone;
    const logits = await this.loop.submit(this.seq, Int32Array.of(token), this.#pos, once);
    this.#pos += 1;
    return logits;
  }

  generate(
    logits: Float32Array,
    n: number,
    sampling: SamplingParams,
    sampler: SamplerState,
  ): AsyncGenerator<{ token: number; logits: Float32Array }> {
    return sampleAndStep(this, logits, n, sampling, sampler);
  }

  /** Drops queued work and removes the sequence's KV cells and recurrent state. */
  async wipe(): Promise<void> {
    this.loop.cancel(this.seq, "the session ended");
    await this.ctx.serialize(() => {
      if (!this.ctx.seqRm(this.seq)) {
        throw new Error(`Internal error: llama.cpp did not remove sequence ${this.seq}`);
      }
    });
    this.#pos = 0;
  }

  #mustFit(n: number): void {
    if (this.#pos + n > this.contextTokens) {
      throw new UsageError(
        `${this.#pos + n} tokens do not fit this sequence's ${this.contextTokens} context tokens`,
        { hint: "use a larger --ctx, a shorter prompt or fewer generated tokens" },
      );
    }
  }
}
