/**
 * Request-local suffix N-gram proposer. Built from the committed token history of one request
 * (the prompt plus target-committed tokens, never drafts), it proposes up to k draft tokens by
 * finding the longest earlier occurrence of the history's current suffix and copying what
 * followed it. Every structure is bounded; nothing is shared between requests.
 *
 * After a handoff the decoder rebuilds it from the `history` component, so it needs no model
 * state to travel.
 *
 * @module
 */
import { assert, LimitExceededError, UsageError } from "./errors.ts";

/** Bounds of a proposer, each with its unit last. */
export interface SuffixOptions {
  /**
   * Shortest suffix that counts as a match (tokens), 3 to 64; also the index key length.
   * Shorter matches propose nothing (they mostly predict noise).
   */
  ngramMin: number;
  /** Longest suffix compared (tokens), ngramMin to 64; longer matches are not distinguished. */
  ngramMax: number;
  /** Most committed tokens one request may hold. */
  historyTokensMax: number;
  /** Most distinct index keys; later new keys are not indexed. */
  indexKeysMax: number;
  /** Most recent positions kept per key; older ones are dropped. */
  positionsPerKeyMax: number;
  /**
   * The proposal cap: largest k `propose` accepts (tokens). The draft actually proposed also
   * grows with the match: a match of m tokens proposes at most m - ngramMin + 1.
   */
  draftTokensMax: number;
}

/** The range `ngramMin` and `ngramMax` must lie in (tokens). */
export const NGRAM_MIN_FLOOR = 3;
export const NGRAM_MAX_CEILING = 64;

export const DEFAULT_SUFFIX_OPTIONS: Readonly<SuffixOptions> = {
  ngramMin: 3,
  ngramMax: 16,
  historyTokensMax: 1 << 20,
  indexKeysMax: 1 << 16,
  positionsPerKeyMax: 8,
  draftTokensMax: 16,
};

/**
 * A suffix-match draft proposer over one request's committed tokens.
 *
 * @example
 * ```ts
 * const p = new SuffixProposer([5, 6, 7, 8, 5, 6]);
 * p.propose(2); // [7, 8]: "5 6" occurred before, followed by 7 8
 * p.append([7]); // committed by the target model
 * ```
 */
export class SuffixProposer {
  readonly #o: SuffixOptions;
  readonly #tokens: number[] = [];
  // Key: the ngramMin tokens ending at position e (exclusive); value: such e, oldest first.
  readonly #index = new Map<string, number[]>();

  constructor(history: ArrayLike<number> = [], options: Partial<SuffixOptions> = {}) {
    this.#o = { ...DEFAULT_SUFFIX_OPTIONS, ...options };
    const o = this.#o;
    const ok = Object.values(o).every((v) => Number.isSafeInteger(v) && v >= 1) &&
      NGRAM_MIN_FLOOR <= o.ngramMin && o.ngramMin <= o.ngramMax &&
      o.ngramMax <= NGRAM_MAX_CEILING;
    if (!ok) {
      throw new UsageError(`Invalid suffix proposer options ${JSON.stringify(o)}`, {
        hint: `use positive whole numbers with ${NGRAM_MIN_FLOOR} <= ngramMin <= ngramMax <= ` +
          `${NGRAM_MAX_CEILING}`,
      });
    }
    this.append(history);
  }

  /** Committed tokens held. */
  get length(): number {
    return this.#tokens.length;
  }

  /** Distinct n-gram keys indexed (bounded by `indexKeysMax`). */
  get indexKeys(): number {
    return this.#index.size;
  }

  /**
   * Adds target-committed tokens. Throws LimitExceededError past `historyTokensMax`.
   */
  append(tokens: ArrayLike<number>): void {
    if (this.#tokens.length + tokens.length > this.#o.historyTokensMax) {
      throw new LimitExceededError(
        `Suffix history would exceed historyTokensMax ${this.#o.historyTokensMax} tokens`,
      );
    }
    for (let i = 0; i < tokens.length; i++) {
      const t = tokens[i];
      assert(Number.isSafeInteger(t) && t >= 0, "token ids are non-negative integers");
      this.#tokens.push(t);
      this.#indexEnd(this.#tokens.length);
    }
  }

  #indexEnd(end: number): void {
    const n = this.#o.ngramMin;
    if (end < n) return;
    const key = this.#key(end);
    let list = this.#index.get(key);
    if (!list) {
      if (this.#index.size >= this.#o.indexKeysMax) return;
      list = [];
      this.#index.set(key, list);
    }
    list.push(end);
    if (list.length > this.#o.positionsPerKeyMax) list.shift();
  }

  #key(end: number): string {
    return this.#tokens.slice(end - this.#o.ngramMin, end).join(",");
  }

  /**
   * Up to `k` draft tokens continuing the longest earlier match of the current suffix (ties go
   * to the most recent occurrence), at most `matchLength - ngramMin + 1` of them: the draft
   * grows with the evidence. Empty when no suffix of at least `ngramMin` tokens occurred
   * before. `pending` are tokens after the committed history that are not committed yet (an
   * MTP draft prefix): the suffix is taken of history + pending, the continuation still comes
   * from committed tokens only, and nothing is indexed. Work per call is bounded by
   * `positionsPerKeyMax * ngramMax` comparisons.
   */
  propose(k: number, pending: ArrayLike<number> = []): number[] {
    if (!Number.isSafeInteger(k) || k < 0 || k > this.#o.draftTokensMax) {
      throw new UsageError(`Invalid draft length ${k}: must be 0 to ${this.#o.draftTokensMax}`);
    }
    const h = this.#tokens;
    const at = (i: number) => i < h.length ? h[i] : pending[i - h.length];
    const end = h.length + pending.length;
    const n = this.#o.ngramMin;
    if (k === 0 || end < n) return [];
    const key: number[] = [];
    for (let i = end - n; i < end; i++) key.push(at(i));
    const candidates = this.#index.get(key.join(",")) ?? [];
    let best = -1;
    let bestLength = 0;
    for (let c = candidates.length - 1; c >= 0; c--) {
      const e = candidates[c];
      if (e >= h.length) continue; // nothing committed follows it
      const length = this.#matchLength(e, end, at);
      if (length > bestLength) {
        best = e;
        bestLength = length;
      }
    }
    if (best < 0) return [];
    const take = Math.min(k, bestLength - n + 1);
    return h.slice(best, Math.min(best + take, h.length));
  }

  // Length of the common suffix of seq[..e) and seq[..end), from ngramMin up to ngramMax.
  #matchLength(e: number, end: number, at: (i: number) => number): number {
    let m = this.#o.ngramMin;
    while (m < this.#o.ngramMax && e - m - 1 >= 0 && at(e - m - 1) === at(end - m - 1)) m++;
    return m;
  }
}
