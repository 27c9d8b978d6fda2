/**
 * The target side of speculative decoding on one sequence: one `llama_decode` of k+1
 * positions with logits for every row, then the rollback of the rejected positions.
 *
 * Rollback differs by memory kind, and the kind is read from the context, never assumed:
 * - `attention` (dense, ISWA): `llama_memory_seq_rm` trims the KV tail.
 * - `native` (hybrid nemotron_h, hybrid-moe-mtp nemotron_h_moe): the context was created with
 *   `n_rs_seq >= k` and llama.cpp kept it (`llama_n_rs_seq`), so `seq_rm` of the tail restores
 *   the recurrent rows of the last kept position as well as trimming attention KV. Row 0 (the
 *   committed token) is always kept, so a rollback never covers the entire last decode, which
 *   avoids the upstream bug where that returns true without restoring (issue 26695).
 * - `checkpoint` (plain mamba2: llama.cpp forces `n_rs_seq` to 0): the sequence state is
 *   saved before a verify that carries drafts; on a rejection it is restored and the accepted
 *   tokens are decoded again, whose last row gives the next logits.
 *
 * @module
 */
import { RuntimeLibraryError, UsageError } from "../core/errors.ts";
import { LlamaBatch } from "./batch.ts";
import type { LlamaContext } from "./context.ts";

export type RollbackKind = "attention" | "native" | "checkpoint";

/** `llama_n_rs_seq` of the context: recurrent snapshots kept per sequence (0: none). */
export function recurrentSnapshots(ctx: LlamaContext): number {
  return ctx.model.lib.symbols.llama_n_rs_seq(ctx.ptr);
}

/**
 * How `ctx` rolls back rejected positions. A hybrid model without native snapshots has no
 * path here (its checkpoint would need the attention tail trimmed separately): null.
 */
export function rollbackKind(ctx: LlamaContext, draftTokensMax: number): RollbackKind | null {
  const info = ctx.model.info();
  if (!info.isRecurrent && !info.isHybrid) return "attention";
  if (recurrentSnapshots(ctx) >= draftTokensMax) return "native";
  return info.isHybrid ? null : "checkpoint";
}

/** What one verify decode returned. */
export interface VerifyRows {
  /** Logits of each row: row i is the target's distribution after tokens[0..i]. */
  logits: Float32Array[];
}

export class Verifier {
  readonly kind: RollbackKind;
  readonly #batch: LlamaBatch;
  #checkpoint: Uint8Array<ArrayBuffer> | null = null;
  #last: { tokens: number[]; pos0: number } | null = null;

  constructor(readonly ctx: LlamaContext, readonly draftTokensMax: number) {
    const kind = rollbackKind(ctx, draftTokensMax);
    if (kind === null) {
      throw new UsageError(
        `This hybrid context keeps ${recurrentSnapshots(ctx)} recurrent snapshots, fewer ` +
          `than the ${draftTokensMax} draft tokens speculation may roll back`,
        { hint: `create the context with nRsSeq >= ${draftTokensMax}, or use --speculation none` },
      );
    }
    this.kind = kind;
    this.#batch = new LlamaBatch(draftTokensMax + 1);
  }

  /**
   * Decodes `tokens` (the committed token, then the drafts) at `pos0..` with logits for every
   * row. The caller must then call `keep` before the next verify.
   */
  async verify(tokens: number[], pos0: number): Promise<VerifyRows> {
    if (tokens.length < 1 || tokens.length > this.draftTokensMax + 1) {
      throw new UsageError(`A verify step takes 1 to ${this.draftTokensMax + 1} tokens`);
    }
    this.#checkpoint = this.kind === "checkpoint" && tokens.length > 1
      ? await this.ctx.stateSeqGet(0)
      : null;
    this.#batch.clear();
    for (let i = 0; i < tokens.length; i++) this.#batch.add(tokens[i], pos0 + i, true);
    await this.ctx.decode(this.#batch);
    const logits: Float32Array[] = [];
    for (let i = 0; i < tokens.length; i++) logits.push(this.ctx.logits(i));
    this.#last = { tokens, pos0 };
    return { logits };
  }

  /**
   * Keeps the first `n` rows of the last verify (n >= 1) and rolls back the rest. Returns the
   * logits after the last kept row when the rollback recomputed them (checkpoint replay),
   * else null (the verify row stands).
   */
  async keep(n: number): Promise<Float32Array | null> {
    const last = this.#last;
    if (last === null) throw new Error("Internal error: keep() without a verify");
    this.#last = null;
    if (n < 1 || n > last.tokens.length) throw new Error(`Internal error: keep(${n})`);
    const checkpoint = this.#checkpoint;
    this.#checkpoint = null;
    if (n === last.tokens.length) return null;
    const cut = last.pos0 + n;
    if (this.kind !== "checkpoint") {
      if (!this.ctx.seqRm(0, cut, -1)) {
        throw new RuntimeLibraryError(
          `llama.cpp refused to roll back positions from ${cut} (${this.kind} rollback)`,
        );
      }
      return null;
    }
    await this.ctx.stateSeqSet(checkpoint!, 0);
    this.#batch.clear();
    for (let i = 0; i < n; i++) this.#batch.add(last.tokens[i], last.pos0 + i, i === n - 1);
    await this.ctx.decode(this.#batch);
    return this.ctx.logits(-1);
  }
}
