/**
 * The prefill worker's exact-prefix cache (issue #12): a request whose prompt starts with a
 * prefix this worker computed before, for the same tenant, restores that prefix's state into
 * its sequence and prefills only the rest; the handoff then exports the whole state as usual
 * (restored pages are exported from the context like computed ones, marked cached).
 *
 * An entry is a whole-sequence snapshot (`llama_state_seq_get_data`, flags 0) taken at a block
 * boundary while the prompt is prefilled: attention KV for its tokens *and* the recurrent
 * (conv + SSM) state at exactly its end, in one blob, so a hit can never restore KV without the
 * matching recurrent state. Recurrent state cannot be rewound, so the prefill stops at each
 * chosen boundary (chunks end there) to take the snapshot: `prefixCheckpointsMax` block
 * boundaries spread evenly up to the deepest one before the prompt's end (at least one token is
 * always computed: the first token needs the last position's logits). Dense models take the same checkpoints (no
 * trimming of a deeper one).
 *
 * Families: `dense`, `hybrid` and `hybrid-moe-mtp` are cached; with an MTP draft a checkpoint
 * also holds the draft context's sequence state and its pending hidden row at the same
 * position, and both are restored (the draft's pages are exported too). `iswa` is not: its
 * sliding-window ring is not tested under restore. `recurrent` is not: its handoff has no
 * pages, so telemetry could not report the split. Each refusal is named (`PrefixPlan.off`).
 *
 * Bounds: `prefixCacheBytesMax` over all entries (LRU by bytes, see core/prefix_index.ts); no
 * persistence; entries are zeroed when evicted and when the worker stops.
 */
import { PrefixIndex } from "../core/prefix_index.ts";
import type { ModelFamily } from "../core/schema.ts";
import type { Engine } from "./engine.ts";
import type { MtpDraft } from "../ffi/mtp.ts";

export interface PrefixCacheOptions {
  /** Bytes all checkpoints may hold together; 0 turns the cache off. */
  prefixCacheBytesMax: number;
  /** Tokens per block: checkpoints and hits sit at multiples of this. */
  prefixBlockTokens: number;
  /** Checkpoints taken per request (the last block boundaries before the prompt end). */
  prefixCheckpointsMax: number;
}

/**
 * Off by default: one hybrid checkpoint costs at least a recurrent snapshot (165 MiB for the
 * lab model) plus the KV of its tokens, so an operator opts in with a budget.
 */
export const DEFAULT_PREFIX_CACHE: Readonly<PrefixCacheOptions> = {
  prefixCacheBytesMax: 0,
  prefixBlockTokens: 256,
  prefixCheckpointsMax: 4,
};

/** Families whose whole-sequence snapshot is a tested, exact checkpoint. */
const CACHED_FAMILIES: ReadonlySet<ModelFamily> = new Set([
  "dense",
  "iswa",
  "recurrent",
  "hybrid",
  "hybrid-moe-mtp",
]);

function erase(s: Snapshot): void {
  s.state.fill(0);
  s.draft?.state.fill(0);
  s.draft?.pending.fill(0);
}

interface Snapshot {
  state: Uint8Array<ArrayBuffer>;
  /** The MTP draft context's sequence state and pending hidden row at the same position. */
  draft: { state: Uint8Array<ArrayBuffer>; pending: Float32Array } | null;
  /** Requests restoring from it now: eviction erases it once they are done. */
  pins: number;
  erase: boolean;
}

/** What one request does with the cache. */
export interface PrefixPlan {
  /** Tokens restored into the sequence (0: a miss or the cache is off). */
  restoredTokens: number;
  /** Positions where the prefill stops to take a checkpoint (ascending, after restoredTokens). */
  checkpoints: number[];
  /** Takes the checkpoint at `pos` (the sequence holds exactly the first `pos` tokens). */
  onCheckpoint: (pos: number) => Promise<void>;
  /** Why this request does not use the cache (null: it does). No content. */
  off: string | null;
}

export class PrefixCache {
  readonly #index: PrefixIndex<Snapshot>;

  constructor(readonly options: PrefixCacheOptions, readonly family: ModelFamily) {
    this.#index = new PrefixIndex<Snapshot>(
      { blockTokens: options.prefixBlockTokens, prefixCacheBytesMax: options.prefixCacheBytesMax },
      (entry) => {
        entry.value.erase = true;
        if (entry.value.pins === 0) erase(entry.value);
      },
    );
  }

  /** Bytes and entries held (no hit counts: they would tell tenants apart). */
  get counters(): { prefixCacheBytes: number; prefixCacheEntries: number } {
    return { prefixCacheBytes: this.#index.bytes, prefixCacheEntries: this.#index.size };
  }

  /**
   * Looks up the longest cached prefix of `prompt` for `tenantId`, restores it into the
   * engine's (empty) sequence, and plans the checkpoints of the rest. A refused restore leaves
   * the sequence empty and the request computes cold (said in `off`).
   */
  async prepare(
    tenantId: string,
    prompt: Int32Array,
    engine: Engine,
    draft: MtpDraft | null,
  ): Promise<PrefixPlan> {
    const none = (off: string | null): PrefixPlan => ({
      restoredTokens: 0,
      checkpoints: [],
      onCheckpoint: () => Promise.resolve(),
      off,
    });
    if (!this.#index.enabled) return none("prefix cache off (prefixCacheBytesMax 0)");
    if (!CACHED_FAMILIES.has(this.family)) {
      return none(
        `prefix cache not used for the ${this.family} family (see serve/prefix_cache.ts)`,
      );
    }
    let restored = 0;
    let off: string | null = null;
    const hit = await this.#index.lookup(tenantId, prompt);
    if (hit) {
      const snap = hit.entry.value;
      snap.pins++;
      try {
        await engine.ctx.stateSeqSet(snap.state, 0);
        if (engine.ctx.seqPosMax(0) !== hit.cachedTokens - 1) {
          throw new Error(`restored sequence ends at ${engine.ctx.seqPosMax(0) + 1}`);
        }
        if (draft) {
          if (!snap.draft) throw new Error("the checkpoint has no MTP draft state");
          await draft.ctx.stateSeqSet(snap.draft.state, 0);
          if (draft.ctx.seqPosMax(0) !== hit.cachedTokens - 1) {
            throw new Error(`restored draft sequence ends at ${draft.ctx.seqPosMax(0) + 1}`);
          }
          draft.adoptPending(snap.draft.pending.slice(), hit.cachedTokens - 1);
        }
        engine.adoptPosition(hit.cachedTokens);
        restored = hit.cachedTokens;
      } catch (error) {
        await engine.wipe();
        if (draft) {
          draft.ctx.clearMemory();
          draft.resetPending();
        }
        off = `prefix restore refused (${(error as Error).message}); computed cold`;
      } finally {
        if (--snap.pins === 0 && snap.erase) erase(snap);
      }
    }
    const block = this.options.prefixBlockTokens;
    const deepest = Math.floor((prompt.length - 1) / block) * block;
    // Spread over the prompt, not bunched at its end: the k-th of N sits at k/N of the deepest
    // boundary (rounded down to a block), so a later prompt sharing, say, 75% of this one finds
    // a checkpoint at or just below the shared length; the N-th is the deepest (a follow-up turn
    // that extends this prompt reuses all of it).
    const n = this.options.prefixCheckpointsMax;
    const checkpoints = [
      ...new Set(
        Array.from({ length: n }, (_, i) => Math.floor(((i + 1) * deepest) / n / block) * block),
      ),
    ].filter((b) => b > restored);
    return {
      restoredTokens: restored,
      checkpoints,
      onCheckpoint: async (pos) => {
        if (engine.position !== pos) return; // not where the plan said: take nothing
        const state = await engine.ctx.stateSeqGet(0);
        const value: Snapshot = {
          state,
          draft: draft && { state: await draft.ctx.stateSeqGet(0), pending: draft.pending.slice() },
          pins: 0,
          erase: false,
        };
        const bytes = state.byteLength + (value.draft?.state.byteLength ?? 0) +
          (value.draft?.pending.byteLength ?? 0);
        const tokens = prompt.subarray(0, pos);
        const kept = await this.#index.insert({ tenantId, tokens, bytes, value });
        if (!kept) erase(value); // larger than the whole budget: never stored
      },
      off,
    };
  }

  /** Erases every entry (the worker stops). */
  clear(): void {
    this.#index.clear();
  }
}
