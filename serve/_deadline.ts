/** Bounded waits shared by the serve roles: every wait has an end. */

/** Resolves like `promise`, or rejects with `onTimeout()` once `ms` have passed. */
export async function within<T>(
  promise: Promise<T>,
  ms: number,
  onTimeout: () => Error,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(onTimeout()), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until `promise` settles or `ms` have passed, whichever is first. Never rejects. */
export async function atMost(promise: Promise<unknown>, ms: number): Promise<void> {
  await within(promise, ms, () => new Error("timeout")).catch(() => {});
}
