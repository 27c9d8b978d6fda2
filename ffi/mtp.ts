/**
 * The MTP (nextn) draft context of a hybrid-moe-mtp target, driven as llama.cpp's draft-mtp
 * does: the target outputs nextn rows for every token; after each target decode the draft
 * decodes the same tokens and positions, row k carrying the target's row k-1 (row 0 the
 * pending row of the previous batch); the pending row is the target's last row.
 */
import { LlamaBatch } from "./batch.ts";
import { LlamaContext } from "./context.ts";

export class MtpDraft implements Disposable {
  #pending: Float32Array;

  private constructor(readonly target: LlamaContext, readonly ctx: LlamaContext) {
    this.#pending = new Float32Array(target.nEmbd);
  }

  /**
   * Creates the draft context beside `target` (its model must be loaded with MTP), with the
   * target's numerics, and turns on nextn rows on both.
   */
  static async open(target: LlamaContext): Promise<MtpDraft> {
    const ctx = await LlamaContext.create(target.model, { ...target.options, mtp: true });
    return MtpDraft.adopt(target, ctx);
  }

  /** Wraps an existing draft context (created with `mtp: true`) for `target`. */
  static adopt(target: LlamaContext, draft: LlamaContext): MtpDraft {
    target.setEmbeddingsNextn(true, false);
    draft.setEmbeddingsNextn(true, true);
    return new MtpDraft(target, draft);
  }

  /** After the target decoded `tokens` at `pos0..`: the draft's catch-up decode. */
  async catchUp(tokens: Int32Array, pos0: number): Promise<void> {
    const n = tokens.length;
    const batch = new LlamaBatch(n, this.target.nEmbd);
    for (let k = 0; k < n; k++) {
      const h = k === 0 ? this.#pending : this.target.nextnEmbedding(k - 1);
      batch.add(tokens[k], pos0 + k, false, 0, h);
    }
    const last = this.target.nextnEmbedding(n - 1);
    await this.ctx.decode(batch);
    this.#pending = last;
  }

  /** The pending hidden row itself. */
  get pending(): Float32Array {
    return this.#pending;
  }

  /** The pending hidden row (n_embd little-endian f32), for the `mtp-hidden` component. */
  pendingBytes(): Uint8Array {
    return new Uint8Array(this.#pending.buffer.slice(0) as ArrayBuffer);
  }

  /** Sets the pending row after an import. */
  adoptPending(row: Float32Array): void {
    this.#pending = row;
  }

  /** One greedy draft token after `token` at `pos` (uses and keeps the draft state). */
  async draftNext(token: number, pos: number): Promise<number> {
    const batch = new LlamaBatch(1, this.target.nEmbd);
    batch.add(token, pos, true, 0, this.#pending);
    await this.ctx.decode(batch);
    const logits = this.ctx.logits(-1);
    let best = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
    return best;
  }

  [Symbol.dispose](): void {
    this.ctx.free();
  }
}
