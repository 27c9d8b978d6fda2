/**
 * The MTP (nextn) draft context of a hybrid-moe-mtp target, driven as llama.cpp's draft-mtp
 * does: the target outputs nextn rows for every token; after each target decode the draft
 * decodes the same tokens and positions, row k carrying the target's row k-1 (row 0 the
 * pending row of the previous batch); the pending row is the target's last row.
 */
import { LlamaBatch } from "./batch.ts";
import { LlamaContext } from "./context.ts";

/**
 * The draft's state against its target (see `MtpDraft.readiness`): `ready` when its KV ends
 * at the target's last position and it holds that position's hidden row; `lagging-one` when
 * it is one token behind (right after a handoff's probe step, or any single target step)
 * and that token's target rows are the last decode's; otherwise `not-ready`.
 */
export type MtpReadiness = "ready" | "lagging-one" | "not-ready";

export class MtpDraft implements Disposable {
  #pending: Float32Array;
  /** Position whose target hidden row `#pending` is (-1: none). */
  #pendingPos = -1;

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
    this.#pendingPos = pos0 + n - 1;
  }

  /** The pending hidden row itself. */
  get pending(): Float32Array {
    return this.#pending;
  }

  /** The pending hidden row (n_embd little-endian f32), for the `mtp-hidden` component. */
  pendingBytes(): Uint8Array {
    return new Uint8Array(this.#pending.buffer.slice(0) as ArrayBuffer);
  }

  /**
   * Sets the pending row after an import: the hidden row of position `pos` (default: the
   * draft KV's last position, which is what a handoff imports it with).
   */
  adoptPending(row: Float32Array, pos = this.ctx.seqPosMax(0)): void {
    this.#pending = row;
    this.#pendingPos = pos;
  }

  /** Forgets the pending row (the draft's memory was wiped). */
  resetPending(): void {
    this.#pending = new Float32Array(this.target.nEmbd);
    this.#pendingPos = -1;
  }

  /**
   * What was verified about the draft state against a target whose next position is
   * `targetPos`: the draft KV's last position and the pending row's position must agree.
   */
  readiness(targetPos: number): MtpReadiness {
    const kv = this.ctx.seqPosMax(0);
    if (this.#pendingPos < 0 || kv !== this.#pendingPos) return "not-ready";
    if (kv === targetPos - 1) return "ready";
    if (kv === targetPos - 2) return "lagging-one";
    return "not-ready";
  }

  /**
   * Up to `m` greedy drafts after the committed `token` at `pos` (the draft must be `ready`
   * for a target at `pos`): the first decode is (token, pos, pending row), which is also the
   * catch-up row of `token`; each later one feeds back the draft's own nextn row. Returns the
   * drafts and the logits each was taken from. `acceptVerified` removes the draft-only rows.
   */
  async propose(token: number, pos: number, m: number): Promise<{
    tokens: number[];
    logits: Float32Array[];
  }> {
    const out = { tokens: [] as number[], logits: [] as Float32Array[] };
    const batch = new LlamaBatch(1, this.target.nEmbd);
    let h = this.#pending;
    let t = token;
    for (let i = 0; i < m; i++) {
      batch.clear();
      batch.add(t, pos + i, true, 0, h);
      await this.ctx.decode(batch);
      const logits = this.ctx.logits(-1);
      let best = 0;
      for (let j = 1; j < logits.length; j++) if (logits[j] > logits[best]) best = j;
      out.tokens.push(best);
      out.logits.push(logits);
      h = this.ctx.nextnEmbedding(0);
      t = best;
    }
    return out;
  }

  /**
   * After the target verified `[token, ...drafts]` at `pos` (its last decode) and kept
   * `accepted` of the drafts: drops the draft's own rows after `pos`, decodes `token` (unless
   * `propose` already did) and the accepted drafts with the target's hidden rows, and takes
   * the last kept row as pending. The draft is then `ready` for the target at
   * `pos + accepted.length + 1`.
   */
  async acceptVerified(token: number, accepted: number[], pos: number): Promise<void> {
    this.ctx.seqRm(0, pos + 1, -1);
    const withToken = this.ctx.seqPosMax(0) < pos;
    const n = accepted.length + (withToken ? 1 : 0);
    if (n > 0) {
      const batch = new LlamaBatch(n, this.target.nEmbd);
      if (withToken) batch.add(token, pos, false, 0, this.#pending);
      for (let k = 0; k < accepted.length; k++) {
        batch.add(accepted[k], pos + 1 + k, false, 0, this.target.nextnEmbedding(k));
      }
      await this.ctx.decode(batch);
    }
    this.#pending = this.target.nextnEmbedding(accepted.length);
    this.#pendingPos = pos + accepted.length;
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
