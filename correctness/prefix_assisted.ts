/**
 * The `prefix-assisted` variant of the handoff matrix (issue #12): the same prompt handed off
 * after a prefix-cache hit instead of a cold prefill, compared with the cold continuation.
 *
 * An earlier prompt shares the case's first 75% of tokens and then differs; a prefiller side
 * prefills it through the prefill worker's own cache (serve/prefix_cache.ts: checkpoints spread
 * over the prompt, a dense one cut back on a shorter hit), as the exporter does. A second fresh
 * prefiller side then looks the case's prompt up in that cache, restores the deepest checkpoint
 * at or before the shared length, prefills only the rest, and exports everything (restored
 * pages first); B imports it, commits and continues greedily, and every logit row (and MTP
 * draft row) must equal the cold run's, bit for bit. A miss is a failure (`no-hit`), never a
 * silent cold run.
 */
import type { Family } from "../models/mod.ts";
import { argmax, prefillAndExport } from "../ffi/mod.ts";
import { PrefixCache } from "../serve/prefix_cache.ts";
import {
  adoptHandoff,
  compareContinuations,
  type Continuation,
  continueGreedy,
  openHandoff,
  type PrefillResult,
  Side,
  stageAndCommit,
  syntheticPrompt,
} from "./state_handoff.ts";
import type { VariantResult } from "./matrix.ts";

/** Share of the case's prompt the earlier prompt repeats. */
export const PREFIX_SHARED = 0.75;

/** The earlier prompt: the first PREFIX_SHARED of `tokens`, then a different tail. */
export function earlierPrompt(tokens: Int32Array, nVocab: number): Int32Array {
  const shared = Math.floor(tokens.length * PREFIX_SHARED);
  const out = syntheticPrompt(tokens.length, nVocab, 97);
  out.set(tokens.subarray(0, shared));
  // The tail must differ from its first token on, or the shared length would be longer.
  if (out[shared] === tokens[shared]) out[shared] = 3 + ((tokens[shared] - 2) % (nVocab - 3));
  return out;
}

/** Prefills `tokens` as the exporter does: stopping at the plan's checkpoints, draft caught up. */
async function prefillThroughCache(
  side: Side,
  cache: PrefixCache,
  tokens: Int32Array,
): Promise<number> {
  const { engine, draft } = side;
  const plan = await cache.prepare("correctness", tokens, engine, draft);
  const onChunk = ({ p0, p1 }: { p0: number; p1: number }) =>
    draft ? draft.catchUp(tokens.subarray(p0, p1), p0) : Promise.resolve();
  let from = plan.restoredTokens;
  for (const b of plan.checkpoints) {
    await engine.prefill(tokens.subarray(from, b), onChunk);
    await plan.onCheckpoint(b);
    from = b;
  }
  return plan.restoredTokens;
}

/** The prompt handed off after a prefix hit, continued on `b`, compared with `reference`. */
export async function prefixAssistedVariant(
  a: Side,
  b: Side,
  family: Family,
  tokens: Int32Array,
  reference: Continuation,
  steps: number,
): Promise<VariantResult> {
  const result: VariantResult = {
    variant: "prefix-assisted",
    verdict: "n/a",
    parity: null,
    detail: null,
    generated: 0,
    importPagesUs: 0,
    importFinalUs: 0,
  };
  const config = a.engine.config;
  const n = tokens.length;
  const cache = new PrefixCache({
    prefixCacheBytesMax: Number.MAX_SAFE_INTEGER,
    // Blocks small enough that a 75% prefix reaches a checkpoint whatever the page size.
    prefixBlockTokens: Math.max(1, Math.min(config.chunkTokens, Math.floor(n / 8))),
    prefixCheckpointsMax: 4,
  }, family);
  try {
    {
      using earlier = await Side.open(config, { model: a.engine.model });
      await prefillThroughCache(
        earlier,
        cache,
        earlierPrompt(tokens, a.engine.model.vocab.nTokens),
      );
    }
    using warm = await Side.open(config, { model: a.engine.model });
    const plan = await cache.prepare("correctness", tokens, warm.engine, warm.draft);
    const restored = plan.restoredTokens;
    if (restored === 0) {
      return { ...result, verdict: "no-hit", detail: plan.off ?? "no checkpoint matched" };
    }
    const state = await prefillAndExport(warm.engine.ctx, tokens, {
      chunkTokens: config.chunkTokens,
      draft: warm.draft?.ctx,
      restored: { tokens: restored, mtpPending: warm.draft?.pending.slice() ?? null },
    });
    const prefill: PrefillResult = { state, firstToken: argmax(warm.engine.ctx.logits(-1)) };
    const imp = await openHandoff(b, a.identity, n, steps);
    const t = await stageAndCommit(imp, prefill.state);
    adoptHandoff(b, n, t.mtpHidden);
    const moved = await continueGreedy(b, prefill.firstToken, steps);
    const parity = compareContinuations(reference, moved);
    return {
      ...result,
      parity,
      generated: moved.tokens.length,
      importPagesUs: t.pagesUs,
      importFinalUs: t.finalUs,
      verdict: parity.exact ? "exact" : "differs",
      detail: `restored ${restored} of ${n} tokens from an earlier prompt's checkpoint`,
    };
  } finally {
    cache.clear();
  }
}
