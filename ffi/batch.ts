/**
 * A `llama_batch` whose arrays live in JavaScript memory, so no native free is needed and a
 * batch can carry both token ids and embedding rows (as MTP draft batches require).
 * Each token carries one sequence id (`add`'s `seqId`, default 0): several sequences of one
 * context can share a batch (the decode worker's continuous batching, serve/batch_loop.ts).
 */
import { assert } from "../core/errors.ts";
import { llama_batch } from "./llama.ts";

export class LlamaBatch {
  readonly capacity: number;
  readonly nEmbd: number;
  readonly tokens: Int32Array;
  readonly positions: Int32Array;
  readonly outputs: Int8Array;
  readonly embeddings: Float32Array | null;
  #nSeqId: Int32Array;
  #seqIds: Int32Array;
  #seqIdPtrs: BigUint64Array;
  #struct: Uint8Array<ArrayBuffer>;
  #n = 0;

  /** `nEmbd > 0` adds an embedding row per token (used together with the token ids). */
  constructor(capacity: number, nEmbd = 0) {
    assert(capacity > 0 && Number.isInteger(capacity), `batch capacity ${capacity}`);
    this.capacity = capacity;
    this.nEmbd = nEmbd;
    this.tokens = new Int32Array(capacity);
    this.positions = new Int32Array(capacity);
    this.outputs = new Int8Array(capacity);
    this.embeddings = nEmbd > 0 ? new Float32Array(capacity * nEmbd) : null;
    this.#nSeqId = new Int32Array(capacity).fill(1);
    this.#seqIds = new Int32Array(capacity);
    this.#seqIdPtrs = new BigUint64Array(capacity + 1);
    const base = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(this.#seqIds)));
    for (let i = 0; i < capacity; i++) this.#seqIdPtrs[i] = base + BigInt(i * 4);
    this.#struct = new Uint8Array(llama_batch.size);
    const s = this.#struct;
    llama_batch.set(s, "token", Deno.UnsafePointer.of(this.tokens));
    llama_batch.set(s, "embd", this.embeddings ? Deno.UnsafePointer.of(this.embeddings) : null);
    llama_batch.set(s, "pos", Deno.UnsafePointer.of(this.positions));
    llama_batch.set(s, "n_seq_id", Deno.UnsafePointer.of(this.#nSeqId));
    llama_batch.set(s, "seq_id", Deno.UnsafePointer.of(this.#seqIdPtrs));
    llama_batch.set(s, "logits", Deno.UnsafePointer.of(this.outputs));
  }

  get length(): number {
    return this.#n;
  }

  clear(): void {
    this.#n = 0;
  }

  /** Appends one token at `pos`; `output` asks for its logits. */
  add(token: number, pos: number, output: boolean, seqId = 0, embd?: Float32Array): void {
    assert(this.#n < this.capacity, `batch full (${this.capacity})`);
    const i = this.#n++;
    this.tokens[i] = token;
    this.positions[i] = pos;
    this.outputs[i] = output ? 1 : 0;
    this.#seqIds[i] = seqId;
    if (this.embeddings) {
      assert(embd !== undefined && embd.length === this.nEmbd, "embedding row required");
      this.embeddings.set(embd, i * this.nEmbd);
    }
  }

  /** The sequence id of token `i` of this batch. */
  seqIdAt(i: number): number {
    assert(i >= 0 && i < this.#n, `batch index ${i} outside [0, ${this.#n})`);
    return this.#seqIds[i];
  }

  /** Fills the batch with a run of tokens at consecutive positions; logits for the last only. */
  fill(tokens: ArrayLike<number>, pos0: number, outputLast = true, seqId = 0): void {
    this.clear();
    for (let i = 0; i < tokens.length; i++) {
      this.add(tokens[i], pos0 + i, outputLast && i === tokens.length - 1, seqId);
    }
  }

  /** The by-value struct for `llama_decode`; valid while this batch is alive. */
  struct(): Uint8Array<ArrayBuffer> {
    llama_batch.set(this.#struct, "n_tokens", this.#n);
    return this.#struct;
  }
}
