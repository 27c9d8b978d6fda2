/**
 * The prefill worker's exact-prefix cache (issue #12): a request whose prompt starts with a
 * prefix this worker computed before, for the same tenant, restores that prefix's state into
 * its sequence and prefills only the rest; the handoff then exports the whole state as usual
 * (restored pages are exported from the context like computed ones, marked cached).
 *
 * An entry is a whole-sequence snapshot (`llama_state_seq_get_data`, flags 0) taken while the
 * prompt is prefilled: attention KV for its tokens *and* whatever else the family's memory holds
 * at exactly its end (recurrent conv + SSM state, the SWA ring), in one blob, so a hit can never
 * restore KV without the matching rest. Such state cannot be rewound, so the prefill stops at
 * each chosen position (a chunk ends there) to take the snapshot: `prefixCheckpointsMax` block
 * boundaries spread evenly up to the deepest one before the prompt's end, plus the request's
 * last user-turn ends (`TurnHints`, from the API's chat template). At least one token is always
 * computed: the first token needs the last position's logits.
 *
 * Families (every one is cached):
 * - `dense`: KV only, so one checkpoint (the deepest block boundary) is cut back
 *   (`llama_memory_seq_rm`) to serve a hit at any block boundary below it.
 * - `iswa`: the global cache's page [0, P) and the SWA ring as shim pages, restored through a
 *   StagedImport as a decoder imports a handoff: cells land at their own indices. (Restored
 *   with `llama_state_seq_set_data`, the ring's live cells land from cell 0, and once the ring
 *   wraps the continuation differs: measured, prefix_restore_test.ts.) Needs the native shim,
 *   else not cached (named). A ring cannot be cut back, so hits sit at checkpoints.
 * - `recurrent` (mamba2): the conv + SSM state at the checkpoint; no pages, so the split is
 *   reported through `ExportPrefix.onUnpagedTokens`.
 * - `hybrid`: KV plus the recurrent state at the checkpoint.
 * - `hybrid-moe-mtp`: as hybrid, plus the MTP draft context's sequence state and its pending
 *   hidden row at the same position (both restored; the draft's pages are exported too).
 *
 * Bounds: `prefixCacheBytesMax` over all entries (LRU by bytes, see core/prefix_index.ts); no
 * persistence; entries are zeroed when evicted and when the worker stops.
 */
import { PrefixIndex } from "../core/prefix_index.ts";
import type { ModelFamily } from "../core/schema.ts";
import type { Engine } from "./engine.ts";
import { tokenizePrompt } from "./prompt_tokens.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import { exportKvPage, exportSwa, StagedImport, stateBackend } from "../ffi/mod.ts";

/** Largest page of a checkpoint (the whole prefix's global KV, or the SWA ring), in bytes. */
const PAGE_BYTES_MAX = 2 ** 31 - 1;

export interface PrefixCacheOptions {
  /** Bytes all checkpoints may hold together; 0 turns the cache off. */
  prefixCacheBytesMax: number;
  /** Tokens per block: checkpoints and hits sit at multiples of this. */
  prefixBlockTokens: number;
  /**
   * Checkpoints taken per request at block boundaries spread evenly up to the prompt end, and
   * at most as many again at the request's last user-turn ends (a chat template's).
   */
  prefixCheckpointsMax: number;
}

/** Where a chat prompt's user turns end (PrefillRequest.turnEnds), to checkpoint there. */
export interface TurnHints {
  /** The prompt text the offsets index. */
  text: string;
  /** UTF-16 offsets into `text` where a user turn ends (ascending). */
  turnEnds: readonly number[];
  /**
   * The prompt's special-token spans (UTF-8 byte offsets, PrefillRequest.promptSpecialSpans):
   * a head is tokenized with the spans that lie inside it, as the prompt itself was.
   */
  specialSpans?: readonly number[];
}

/** The spans of `spans` (flat UTF-8 byte pairs) that end within the first `bytes` bytes. */
export function spansWithin(spans: readonly number[], bytes: number): number[] {
  const out: number[] = [];
  for (let i = 0; i + 1 < spans.length && spans[i + 1] <= bytes; i += 2) {
    out.push(spans[i], spans[i + 1]);
  }
  return out;
}

/**
 * Token positions where the user turns of `hints` end in `prompt` (its tokens): each offset's
 * text is tokenized and the boundary is where its tokens stop agreeing with the prompt's (a
 * merge across the boundary moves it back a token). Positions outside (0, prompt.length) and
 * repeats are dropped; the last `max` are kept (a follow-up turn hits the latest).
 */
export function turnBoundaries(
  tokenize: (text: string, specialSpans: readonly number[]) => Int32Array,
  prompt: Int32Array,
  hints: TurnHints,
  max: number,
): number[] {
  const out = new Set<number>();
  for (const end of hints.turnEnds.slice(-max)) {
    if (!(end > 0 && end < hints.text.length)) continue;
    const text = hints.text.slice(0, end);
    const bytes = new TextEncoder().encode(text).length;
    const head = tokenize(text, spansWithin(hints.specialSpans ?? [], bytes));
    let k = 0;
    while (k < head.length && k < prompt.length && head[k] === prompt[k]) k++;
    if (k > 0 && k < prompt.length) out.add(k);
  }
  return [...out].sort((a, b) => a - b);
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

/** Families whose whole-sequence snapshot is a tested, exact checkpoint (all of them). */
const CACHED_FAMILIES: ReadonlySet<ModelFamily> = new Set([
  "dense",
  "iswa",
  "recurrent",
  "hybrid",
  "hybrid-moe-mtp",
]);

function erase(s: Snapshot): void {
  s.state.fill(0);
  s.swa?.fill(0);
  s.draft?.state.fill(0);
  s.draft?.pending.fill(0);
}

interface Snapshot {
  /** `llama_state_seq_get_data` of the sequence; for iswa, the global cache's page [0, P). */
  state: Uint8Array<ArrayBuffer>;
  /**
   * iswa: the SWA ring as a shim page, cells at their own indices. llama.cpp's own state
   * writes the ring's live cells from cell 0, which moves where later tokens land once the
   * ring wraps (measured: logits differ), so iswa checkpoints restore like a handoff's import.
   */
  swa: Uint8Array<ArrayBuffer> | null;
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

  /** Dense KV can be cut back to a shorter prefix; recurrent state and SWA rings cannot. */
  get #trimmable(): boolean {
    return this.family === "dense";
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
    hints?: TurnHints,
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
    if (this.family === "iswa" && (await stateBackend(engine.ctx)).path !== "shim") {
      return none(
        "prefix cache not used for iswa without the native shim (its ring restores exactly only through it)",
      );
    }
    const { restored, off } = await this.#restore(tenantId, prompt, engine, draft);
    return {
      restoredTokens: restored,
      checkpoints: this.#checkpoints(prompt, restored, engine, hints),
      onCheckpoint: (pos) => this.#checkpoint(tenantId, prompt, pos, engine, draft),
      off,
    };
  }

  /** Restores the tenant's deepest cached prefix of `prompt` into `engine` (0: none, or refused). */
  async #restore(
    tenantId: string,
    prompt: Int32Array,
    engine: Engine,
    draft: MtpDraft | null,
  ): Promise<{ restored: number; off: string | null }> {
    let restored = 0;
    let off: string | null = null;
    const hit = await this.#index.lookup(tenantId, prompt);
    if (hit) {
      const snap = hit.entry.value;
      snap.pins++;
      try {
        if (snap.swa) await this.#restoreSwa(engine, snap, hit.cachedTokens);
        else await engine.ctx.stateSeqSet(snap.state, 0);
        // A dense entry deeper than the shared prefix is cut back to it (KV alone can be).
        if (hit.cachedTokens < hit.entry.tokens.length) {
          if (!this.#trimmable || !engine.ctx.seqRm(0, hit.cachedTokens, -1)) {
            throw new Error("the checkpoint cannot be cut back");
          }
        }
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
    return { restored, off };
  }

  /**
   * Where this prompt's prefill stops to be snapshotted, after the `restored` tokens: spread
   * over the prompt, and where the chat template's user turns end.
   */
  #checkpoints(
    prompt: Int32Array,
    restored: number,
    engine: Engine,
    hints?: TurnHints,
  ): number[] {
    const block = this.options.prefixBlockTokens;
    const deepest = Math.floor((prompt.length - 1) / block) * block;
    // Spread over the prompt, not bunched at its end: the k-th of N sits at k/N of the deepest
    // boundary (rounded down to a block), so a later prompt sharing, say, 75% of this one finds
    // a checkpoint at or just below the shared length; the N-th is the deepest (a follow-up turn
    // that extends this prompt reuses all of it). A dense checkpoint can be cut back to any
    // block boundary, so the deepest alone serves every shorter hit.
    const n = this.#trimmable ? 1 : this.options.prefixCheckpointsMax;
    const spread = Array.from(
      { length: n },
      (_, i) => Math.floor(((i + 1) * deepest) / n / block) * block,
    );
    // And where the chat template's user turns end: the next turn of the conversation hits
    // exactly at the end of this one's last user message.
    const turns = hints
      ? turnBoundaries(
        (text, spans) => tokenizePrompt(engine.model.vocab, text, spans),
        prompt,
        hints,
        this.options.prefixCheckpointsMax,
      )
      : [];
    return [...new Set([...spread, ...turns])]
      .filter((b) => b > restored && b < prompt.length)
      .sort((a, b) => a - b);
  }

  /** Snapshots the sequence at `pos` (a checkpoint the plan named) into the cache. */
  async #checkpoint(
    tenantId: string,
    prompt: Int32Array,
    pos: number,
    engine: Engine,
    draft: MtpDraft | null,
  ): Promise<void> {
    if (engine.position !== pos) return; // not where the plan said: take nothing
    const swa = this.family === "iswa";
    const state = swa
      ? await exportKvPage(engine.ctx, 0, pos, { pageBytesMax: PAGE_BYTES_MAX })
      : await engine.ctx.stateSeqGet(0);
    const value: Snapshot = {
      state,
      swa: swa ? await exportSwa(engine.ctx, { pageBytesMax: PAGE_BYTES_MAX }) : null,
      draft: draft && { state: await draft.ctx.stateSeqGet(0), pending: draft.pending.slice() },
      pins: 0,
      erase: false,
    };
    const bytes = state.byteLength + (value.swa?.byteLength ?? 0) +
      (value.draft?.state.byteLength ?? 0) +
      (value.draft?.pending.byteLength ?? 0);
    const tokens = prompt.subarray(0, pos);
    const kept = await this.#index.insert({
      tenantId,
      tokens,
      bytes,
      value,
      trimmable: this.#trimmable,
    });
    if (!kept) erase(value); // larger than the whole budget: never stored
  }

  /** iswa: the global page and the ring staged and committed as a handoff's import would be. */
  async #restoreSwa(engine: Engine, snap: Snapshot, tokens: number): Promise<void> {
    const imp = await StagedImport.open(engine.ctx, {
      nTokens: tokens,
      pageBytesMax: PAGE_BYTES_MAX,
    });
    try {
      await imp.addPage(snap.state);
      await imp.setSwa(snap.swa!);
      await imp.commit();
    } catch (error) {
      await imp.abort();
      throw error;
    }
  }

  /** Erases every entry (the worker stops). */
  clear(): void {
    this.#index.clear();
  }
}
