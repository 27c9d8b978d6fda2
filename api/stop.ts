/**
 * Stop sequences over streamed text. Text arrives in pieces; a stop sequence may straddle two
 * pieces, so the matcher holds back the longest tail that could still begin a stop sequence
 * and releases it once it cannot. On a match, the text before the stop is released and the
 * stop and everything after it are dropped (OpenAI's behaviour: the stop is not returned).
 *
 * Pure: no I/O; the service cancels the request on the workers when `stopped` turns true.
 *
 * @example
 * ```ts
 * const m = new StopMatcher(["\n\n"]);
 * m.push("a\n"); // "a" (the "\n" is held: it may begin "\n\n")
 * m.push("\nb"); // "" and m.stopped === true
 * ```
 */
export class StopMatcher {
  #held = "";
  #stopped = false;

  constructor(readonly stops: readonly string[]) {}

  /** True once a stop sequence matched; later pushes return "". */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Feeds a piece of text; returns the text that is now safe to emit. */
  push(piece: string): string {
    if (this.#stopped) return "";
    const text = this.#held + piece;
    let cut = -1;
    for (const stop of this.stops) {
      const at = text.indexOf(stop);
      if (at >= 0 && (cut < 0 || at < cut)) cut = at;
    }
    if (cut >= 0) {
      this.#stopped = true;
      this.#held = "";
      return text.slice(0, cut);
    }
    const keep = this.#heldLength(text);
    this.#held = text.slice(text.length - keep);
    return text.slice(0, text.length - keep);
  }

  /** At the end of generation: whatever was held back (no stop can match any more). */
  flush(): string {
    const rest = this.#stopped ? "" : this.#held;
    this.#held = "";
    return rest;
  }

  /** Length of the longest suffix of `text` that is a proper prefix of some stop sequence. */
  #heldLength(text: string): number {
    let best = 0;
    for (const stop of this.stops) {
      for (let n = Math.min(stop.length - 1, text.length); n > best; n--) {
        if (text.endsWith(stop.slice(0, n))) {
          best = n;
          break;
        }
      }
    }
    return best;
  }
}
