/**
 * Token sampling in pure TypeScript, so the sampler's whole state is a small value that can
 * travel with a handoff: `{ seed, draws }`. Greedy sampling is argmax with ties broken towards
 * the lowest token id; seeded sampling draws from a counter-based generator, so continuing on
 * another machine only needs the number of draws taken so far.
 *
 * @example
 * ```ts
 * const params = { temperature: 0 };        // greedy
 * const state = { seed: 42, draws: 0 };
 * const token = sampleToken(logits, params, state); // state.draws advances when not greedy
 * ```
 */

export interface SamplingParams {
  /** 0 = greedy. */
  temperature: number;
  /** Keep the k most likely tokens (0 = all). */
  topK?: number;
  /** Keep the smallest set whose probability reaches p (1 = all). */
  topP?: number;
}

/** The sampler's complete state: its seed and how many random draws it has consumed. */
export interface SamplerState {
  seed: number;
  draws: number;
}

/** Index of the largest value; ties go to the lowest index. */
export function argmax(values: Float32Array): number {
  let best = 0;
  let bestValue = values[0];
  for (let i = 1; i < values.length; i++) {
    if (values[i] > bestValue) {
      bestValue = values[i];
      best = i;
    }
  }
  return best;
}

/**
 * The distribution a sampled token is drawn from, after temperature, top-k and top-p: the
 * kept token ids, most likely first, with unnormalized weights; `p(ids[i]) = weights[i] /
 * total`. Tokens outside `ids` have probability 0.
 */
export interface TokenDistribution {
  ids: number[];
  weights: number[];
  total: number;
}

/**
 * The processed distribution of `logits` under `params` (temperature > 0).
 *
 * @example
 * ```ts
 * const d = samplingDistribution(new Float32Array([2, 1, 0]), { temperature: 1, topK: 2 });
 * // d.ids = [0, 1]; d.weights[1] / d.total = e / (e^2 + e)
 * ```
 */
export function samplingDistribution(
  logits: Float32Array,
  params: SamplingParams,
): TokenDistribution {
  if (!(params.temperature > 0)) {
    throw new Error(`Internal error: samplingDistribution(temperature ${params.temperature})`);
  }
  const candidates = topCandidates(logits, params.topK ?? 0);
  const t = params.temperature;
  const maxLogit = logits[candidates[0]];
  const weights = candidates.map((id) => Math.exp((logits[id] - maxLogit) / t));
  let total = weights.reduce((a, b) => a + b, 0);
  const topP = params.topP ?? 1;
  let keep = candidates.length;
  if (topP < 1) {
    let cumulative = 0;
    for (let i = 0; i < candidates.length; i++) {
      cumulative += weights[i] / total;
      if (cumulative >= topP) {
        keep = i + 1;
        break;
      }
    }
    total = weights.slice(0, keep).reduce((a, b) => a + b, 0);
  }
  return { ids: candidates.slice(0, keep), weights: weights.slice(0, keep), total };
}

/** Picks the next token; advances `state.draws` by one for non-greedy sampling. */
export function sampleToken(
  logits: Float32Array,
  params: SamplingParams,
  state: SamplerState,
): number {
  if (params.temperature <= 0) return argmax(logits);
  return drawFrom(samplingDistribution(logits, params), state);
}

/** Draws one token from `d` with one random draw (inverse CDF over the kept ids). */
function drawFrom(d: TokenDistribution, state: SamplerState): number {
  const u = uniform(state.seed, state.draws++) * d.total;
  let acc = 0;
  for (let i = 0; i < d.ids.length; i++) {
    acc += d.weights[i];
    if (u < acc) return d.ids[i];
  }
  return d.ids[d.ids.length - 1];
}

function topCandidates(logits: Float32Array, k: number): number[] {
  const ids = Array.from({ length: logits.length }, (_, i) => i);
  ids.sort((a, b) => logits[b] - logits[a] || a - b);
  return k > 0 ? ids.slice(0, k) : ids;
}

/** A uniform double in [0, 1) from (seed, counter): a stateless, portable generator. */
export function uniform(seed: number, counter: number): number {
  const hi = mix32((seed >>> 0) ^ mix32(counter >>> 0));
  const lo = mix32(hi ^ 0x9e3779b9 ^ Math.floor(counter / 0x100000000));
  return (hi * 0x200000 + (lo >>> 11)) / 0x20000000000000;
}

function mix32(x: number): number {
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d);
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
}
