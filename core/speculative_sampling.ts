/**
 * The speculative acceptance rule under the request's sampler, so that speculation never
 * changes what a request samples, only how fast (Leviathan et al. 2023, Chen et al. 2023).
 *
 * The drafts here (MTP argmax, suffix matches) are deterministic proposals: the draft
 * distribution q is a point mass on the proposed token d. The general rule "accept d with
 * probability min(1, p(d) / q(d)), else draw from max(0, p - q) normalized" then reads:
 * - accept d with probability p(d), where p is the target's processed distribution
 *   (temperature, top-k, top-p: `samplingDistribution`) at that row;
 * - on the first rejection, draw the next token from p with d left out, renormalized (the
 *   residual max(0, p - q): p(x) for x != d, and 0 for d since p(d) <= 1);
 * - after a fully accepted proposal, the bonus token is drawn from p at the last row.
 * Each emitted token is then distributed exactly as sampling the target alone.
 *
 * Greedy (temperature 0) is argmax agreement and draws nothing. Otherwise every accept test
 * and every token draw takes one draw of the project's counter-based generator, so the
 * sampler's state stays `{ seed, draws }`: a seeded run is reproducible, and a decoder that
 * receives the state continues the same stream.
 *
 * @example
 * ```ts
 * const state = { seed: 1, draws: 0 };
 * const a = acceptDrafts(rows, drafts, { temperature: 0.8 }, state); // drafts[0..a) kept
 * const next = sampleAfter(rows[a], { temperature: 0.8 }, state, a < drafts.length ? drafts[a] : null);
 * ```
 *
 * @module
 */
import {
  argmax,
  drawFrom,
  type SamplerState,
  samplingDistribution,
  type SamplingParams,
  type TokenDistribution,
  uniform,
} from "./sampling.ts";

/** p(token) under `d` (0 for a token outside the kept set). */
export function probabilityOf(d: TokenDistribution, token: number): number {
  const i = d.ids.indexOf(token);
  return i < 0 ? 0 : d.weights[i] / d.total;
}

/**
 * How many leading drafts the target accepts. `rows[i]` are the target's logits after the
 * committed token and drafts[0..i) (so `rows.length >= drafts.length`); draft i is tested
 * only when every earlier one was accepted. Sampled: one draw per tested draft.
 */
export function acceptDrafts(
  rows: readonly Float32Array[],
  drafts: readonly number[],
  params: SamplingParams,
  state: SamplerState,
): number {
  if (rows.length < drafts.length) {
    throw new Error(`Internal error: ${rows.length} rows for ${drafts.length} drafts`);
  }
  let a = 0;
  while (a < drafts.length) {
    const ok = params.temperature <= 0
      ? argmax(rows[a]) === drafts[a]
      : uniform(state.seed, state.draws++) < probabilityOf(
        samplingDistribution(rows[a], params),
        drafts[a],
      );
    if (!ok) break;
    a++;
  }
  return a;
}

/**
 * The token after a verify round, from the logits of the first row not accepted: with
 * `rejected` (the draft that row turned down), a draw from the residual, p without
 * `rejected`; with null (every draft accepted, or none proposed), a plain draw from p.
 * Greedy: argmax (which a rejected draft never is). Sampled: one draw.
 */
export function sampleAfter(
  logits: Float32Array,
  params: SamplingParams,
  state: SamplerState,
  rejected: number | null,
): number {
  if (params.temperature <= 0) return argmax(logits);
  return drawFrom(samplingDistribution(logits, params), state, rejected ?? -1);
}

/** One verify round's outcome: `accepted` leading drafts, then `next`. */
export interface RoundOutcome {
  accepted: number;
  next: number;
}

/** `acceptDrafts` then `sampleAfter` on the same rows: a whole round, for callers without rollback replay. */
export function speculativeRound(
  rows: readonly Float32Array[],
  drafts: readonly number[],
  params: SamplingParams,
  state: SamplerState,
): RoundOutcome {
  if (rows.length !== drafts.length + 1) {
    throw new Error(`Internal error: ${rows.length} rows for ${drafts.length} drafts`);
  }
  const accepted = acceptDrafts(rows, drafts, params, state);
  const rejected = accepted < drafts.length ? drafts[accepted] : null;
  return { accepted, next: sampleAfter(rows[accepted], params, state, rejected) };
}
