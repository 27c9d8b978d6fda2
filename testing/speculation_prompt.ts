/**
 * A constructed prompt on which the suffix proposer must fire and the target must accept:
 * `[a, b, c1..cm] + body + [a, b]`, where `c1..cm` is the target's own greedy continuation of
 * the whole prompt. Random-weight test models never repeat a 3-gram on their own (measured on
 * the tiny hybrid: none in 150 prompts x 128 greedy tokens), so a repetitive prompt alone
 * gives the proposer nothing to match; this one is built by fixed-point iteration (the
 * continuation barely depends on the prompt's head, so it converges in one or two rounds).
 * Real llama.cpp, real tokens: nothing is faked, the construction is only checked.
 */
import { argmax } from "../core/sampling.ts";
import type { Engine } from "../serve/engine.ts";
import { testTokens } from "./models.ts";

export interface SelfRepeatingOptions {
  /** Tokens of the continuation copied into the head. */
  copyTokens?: number;
  /** Random tokens between the head and the tail. */
  bodyTokens?: number;
  /** Body salts tried before giving up. */
  saltsMax?: number;
  /** Fixed-point rounds per salt. */
  roundsMax?: number;
}

/**
 * Builds the prompt on `engine` (its memory is cleared before and after). Throws when no salt
 * converges, which would be a fact about the model worth knowing, not a flaky test.
 */
export async function selfRepeatingPrompt(
  engine: Engine,
  options: SelfRepeatingOptions = {},
): Promise<Int32Array> {
  const m = options.copyTokens ?? 8;
  const bodyTokens = options.bodyTokens ?? 48;
  const nVocab = Math.min(engine.model.vocab.nTokens, 950);
  for (let salt = 2; salt < 2 + (options.saltsMax ?? 8); salt++) {
    const body = [...testTokens(bodyTokens, nVocab, salt)];
    const [a, b] = body;
    let copy = new Array<number>(m).fill(body[2]);
    for (let round = 0; round < (options.roundsMax ?? 4); round++) {
      const prompt = Int32Array.from([a, b, ...copy, ...body.slice(2), a, b]);
      const next = await greedy(engine, prompt, m);
      if (next.every((t, i) => t === copy[i])) return prompt;
      copy = next;
    }
  }
  throw new Error("No self-repeating prompt converged on this model");
}

async function greedy(engine: Engine, prompt: Int32Array, n: number): Promise<number[]> {
  engine.ctx.clearMemory();
  engine.adoptPosition(0);
  let logits = await engine.prefill(prompt);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    out.push(argmax(logits));
    if (i < n - 1) logits = await engine.step(out[i]);
  }
  engine.ctx.clearMemory();
  engine.adoptPosition(0);
  return out;
}
