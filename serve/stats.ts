/**
 * Reading a worker's counters (StatsRequest -> WorkerStats): handoffs running, retained and
 * staged bytes, sessions, contexts in use, totals. Counts only, never content. Used by the
 * `stats` command and by tests that check every held counter returns to zero.
 */
import { LimitExceededError } from "../core/mod.ts";
import type { PeerConnection } from "../transport/mod.ts";
import type { WorkerCounters } from "./messages.ts";

/** Asks a worker for its counters over `peer` (a connection used for nothing else). */
export async function queryStats(
  peer: PeerConnection,
  timeoutMs = 2_000,
): Promise<WorkerCounters> {
  const requestId = crypto.randomUUID();
  await peer.send({ type: "StatsRequest", requestId });
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    const msg = await withTimeout(peer.receive(), deadline - performance.now(), "WorkerStats");
    const h = msg?.header as Record<string, unknown> | undefined;
    if (h?.type === "WorkerStats" && h.requestId === requestId) {
      const { type: _type, requestId: _id, ...counters } = h;
      return counters as unknown as WorkerCounters;
    }
  }
  throw new LimitExceededError(`The worker sent no stats within ${timeoutMs} ms`);
}

/** `promise`, or a rejection naming `what` after `ms`. */
export async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new LimitExceededError(`${what} did not arrive within ${Math.round(ms)} ms`)),
      Math.max(0, ms),
    );
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
