/**
 * Log probabilities of a generated token and of the most likely tokens at its position, from
 * the raw logits it was sampled from (log-softmax over the whole vocabulary, before any
 * temperature or truncation, as llama-server's `n_probs` and OpenAI's `logprobs` report).
 */

/** Most alternatives a request may ask for per token (OpenAI's bound). */
export const TOP_LOGPROBS_MAX = 20;

/** One token's log probability and the `k` most likely tokens, `[token, logprob]`, best first. */
export interface TokenLogprob {
  logprob: number;
  top: [number, number][];
}

/**
 * The log probability of `token` under `logits` and the `k` most likely tokens (ties by lower
 * id first).
 *
 * ```ts
 * const lp = tokenLogprob(new Float32Array([0, Math.log(3)]), 1, 1);
 * // lp.logprob ≈ log(3/4), lp.top = [[1, log(3/4)]]
 * ```
 */
export function tokenLogprob(logits: Float32Array, token: number, k: number): TokenLogprob {
  if (!Number.isInteger(k) || k < 0 || k > TOP_LOGPROBS_MAX) {
    throw new RangeError(`top logprobs must be an integer from 0 to ${TOP_LOGPROBS_MAX}, got ${k}`);
  }
  if (!Number.isInteger(token) || token < 0 || token >= logits.length) {
    throw new RangeError(`token ${token} is outside the ${logits.length}-token vocabulary`);
  }
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  const logZ = max + Math.log(sum);
  // The k best so far, ascending by logit, so the worst is at index 0.
  const best: number[] = [];
  if (k > 0) {
    for (let i = 0; i < logits.length; i++) {
      const v = logits[i];
      if (best.length === k && v <= logits[best[0]]) continue;
      let at = 0;
      while (at < best.length && logits[best[at]] < v) at++;
      // Equal logits: the lower id ranks higher (it comes later in this ascending list).
      while (at < best.length && logits[best[at]] === v && best[at] > i) at++;
      best.splice(at, 0, i);
      if (best.length > k) best.shift();
    }
  }
  return {
    logprob: logits[token] - logZ,
    top: best.reverse().map((i) => [i, logits[i] - logZ]),
  };
}
