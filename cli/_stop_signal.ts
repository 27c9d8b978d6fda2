/**
 * How a long-running command (`serve`, `coordinate`) learns it should stop: the first
 * SIGINT/SIGTERM resolves the promise so the command can close cleanly; a second exits at once
 * (130 for SIGINT, 143 for SIGTERM).
 */

/** The first SIGINT/SIGTERM stops cleanly; a second exits at once. */
export function stopSignal(): Promise<Deno.Signal> {
  let signals = 0;
  return new Promise((resolve) => {
    for (const signal of ["SIGINT", "SIGTERM"] as const) {
      Deno.addSignalListener(signal, () => {
        if (++signals > 1) Deno.exit(signal === "SIGINT" ? 130 : 143);
        resolve(signal);
      });
    }
  });
}
