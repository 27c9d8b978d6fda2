/**
 * A request's timeout as "no progress for `ms`": every message that shows the request moving
 * (a token, a progress report, an outcome) pushes it back, so a long valid generation never
 * hits it, and a silent worker is still noticed.
 */
export class IdleTimeout {
  readonly #controller = new AbortController();
  #timer: ReturnType<typeof setTimeout> | undefined;

  constructor(readonly ms: number) {
    this.touch();
  }

  /** Aborted (reason: a TimeoutError DOMException) once `ms` pass without `touch()`. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** The request moved: the next `ms` start now. */
  touch(): void {
    if (this.#controller.signal.aborted) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#controller.abort(new DOMException(`no progress for ${this.ms} ms`, "TimeoutError"));
    }, this.ms);
  }

  /** Stops the timer (the request ended). */
  clear(): void {
    clearTimeout(this.#timer);
  }
}
