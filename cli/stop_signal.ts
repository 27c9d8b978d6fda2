/**
 * How a long-running process learns it should stop (`serve`, `coordinate`, the link matrix in
 * bench/): the first SIGINT/SIGTERM goes to the caller, so it can close cleanly; a second exits
 * at once with the shell's status for that signal (130 for SIGINT, 143 for SIGTERM).
 */

const SIGNALS: readonly Deno.Signal[] = Deno.build.os === "windows"
  ? ["SIGINT"]
  : ["SIGINT", "SIGTERM"];

/** The shell's exit status for a process ended by `signal`: 128 + its number. */
export function exitStatusOf(signal: Deno.Signal): number {
  return 128 + (signal === "SIGINT" ? 2 : 15);
}

/**
 * Calls `onFirst` on the first SIGINT/SIGTERM and exits at once on a second. `remove()` takes
 * the listeners away again (a listener keeps the process alive).
 */
export function listenForStop(onFirst: (signal: Deno.Signal) => void): { remove(): void } {
  let signals = 0;
  const listeners = SIGNALS.map((signal) => {
    const listener = () => {
      if (++signals > 1) Deno.exit(exitStatusOf(signal));
      onFirst(signal);
    };
    Deno.addSignalListener(signal, listener);
    return { signal, listener };
  });
  return {
    remove: () => {
      for (const { signal, listener } of listeners) Deno.removeSignalListener(signal, listener);
    },
  };
}

/** The first SIGINT/SIGTERM resolves the promise; a second exits at once. */
export function stopSignal(): Promise<Deno.Signal> {
  return new Promise((resolve) => listenForStop(resolve));
}
