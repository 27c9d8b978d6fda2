import type { TokenLogprob } from "../core/logprobs.ts";
import type { RunInput } from "./service.ts";
import { StopMatcher } from "./stop.ts";

/**
 * One request's output as it streams: the text cut at its stop sequences (the cut cancels the
 * request through `stopper`), the tokens counted, their log probabilities kept when asked for,
 * and each arrival's timing reported (the first as TTFT, later ones as gaps per token).
 */
export class RequestOutput {
  readonly stopper = new AbortController();
  readonly logprobs: { tokens: number[]; logprobs: (TokenLogprob | null)[] } | null;
  collected = "";
  generated = 0;
  readonly #matcher: StopMatcher;
  #lastTokenAt: number | null = null;

  constructor(
    readonly input: RunInput,
    readonly onTiming: (ttftMs: number | null, gapMs: number, tokens: number) => void,
    readonly t0: number,
  ) {
    this.#matcher = new StopMatcher(input.params.stop);
    this.logprobs = input.params.logprobs === null ? null : { tokens: [], logprobs: [] };
  }

  get stopped(): boolean {
    return this.#matcher.stopped;
  }

  tokens(tokens: number[], lps: (TokenLogprob | null)[] | undefined): void {
    if (this.logprobs) {
      this.logprobs.tokens.push(...tokens);
      this.logprobs.logprobs.push(...(lps ?? tokens.map(() => null)));
    }
    const now = performance.now();
    const last = this.#lastTokenAt;
    this.onTiming(
      last === null ? now - this.t0 : null,
      last === null ? 0 : now - last,
      tokens.length,
    );
    this.#lastTokenAt = now;
    this.generated += tokens.length;
  }

  text(piece: string): void {
    if (this.#matcher.stopped) return;
    this.#emit(this.#matcher.push(piece));
    if (this.#matcher.stopped) this.stopper.abort();
  }

  /** The text a stop sequence might still have needed, once the stream has ended. */
  flush(): void {
    this.#emit(this.#matcher.flush());
  }

  #emit(safe: string): void {
    this.collected += safe;
    if (safe) this.input.onDelta?.(safe);
  }
}
