/**
 * The speculative acceptance rule under the request's sampler, so that speculation never
 * changes what a request samples, only how fast (Leviathan et al. 2023, Chen et al. 2023).
 *
 * The drafts here (MTP argmax, suffix matches) are deterministic proposals: the draft
 * distribution q is a point mass on the proposed token d. The general rule "accept d with
 * probability min(1, p(d) / q(d)), else draw from max(0, p - q) normalized" then reads:
 * - accept d with probability p(d), where p is the target's processed distribution
 *   (temperature, top-k, top-p: `samplingDistribution`) at that row;
 * - on the first rejection, the next token is drawn from p with d left out, renormalized (the
 *   residual max(0, p - q): p(x) for x != d, and 0 for d since p(d) <= 1);
 * - after a fully accepted proposal, the bonus token is drawn from p at the last row.
 *
 * It is carried out by sampling the target at each row exactly as target-only decoding would,
 * with that position's draw, and accepting the draft when the sample equals it: the sample is
 * d with probability p(d) (the acceptance), a sample that is not d is distributed as the
 * residual, and it becomes the next token (`speculativeRound`). So every token is distributed
 * as target-only sampling, and more: token i always takes draw i, whatever was drafted, so a
 * seeded speculative stream is the target-only stream of the same seed (given the same logits;
 * a verify batch may round the last bits differently from a one-token decode, which moves a
 * token only when its draw falls that close to a boundary of the distribution). The sampler's
 * state stays `{ seed, draws }` with draws = tokens sampled: a decoder that receives it after a
 * handoff, or a worker that resumes a lost request by recomputing target-only, continues the
 * same stream.
 *
 * Greedy (temperature 0) is the same rule with argmax for the sample, and draws nothing.
 *
 * @example
 * ```ts
 * const state = { seed: 1, draws: 1 };
 * const { accepted, next } = speculativeRound(rows, drafts, { temperature: 0.8 }, state);
 * // drafts[0..accepted) are kept, `next` follows them; state.draws grew by accepted + 1
 * ```
 *
 * @module
 */
import {
  type SamplerState,
  sampleToken,
  type SamplingParams,
  type TokenDistribution,
} from "./sampling.ts";

/** p(token) under `d` (0 for a token outside the kept set). */
export function probabilityOf(d: TokenDistribution, token: number): number {
  const i = d.ids.indexOf(token);
  return i < 0 ? 0 : d.weights[i] / d.total;
}

/** One verify round's outcome: `accepted` leading drafts, then `next`. */
export interface RoundOutcome {
  accepted: number;
  /** The target's sample at the first row not accepted (the residual or the bonus token). */
  next: number;
}

/**
 * A verify round under the sampler. `rows[i]` are the target's logits after the committed
 * token and drafts[0..i), one more row than drafts. The target is sampled at row 0, 1, ... with
 * one draw each (greedy: argmax, no draw) while its sample equals the draft of that row; the
 * first sample that differs, or the one after the last draft, is `next`.
 */
export function speculativeRound(
  rows: readonly Float32Array[],
  drafts: readonly number[],
  params: SamplingParams,
  state: SamplerState,
): RoundOutcome {
  if (rows.length !== drafts.length + 1) {
    throw new Error(`Internal error: ${rows.length} rows for ${drafts.length} drafts`);
  }
  let accepted = 0;
  for (;;) {
    const next = sampleToken(rows[accepted], params, state);
    if (accepted === drafts.length || next !== drafts[accepted]) return { accepted, next };
    accepted++;
  }
}
