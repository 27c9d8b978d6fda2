/**
 * Test harness for the handoff failure tests: workers in this process (`Worker.start`, for
 * fault injection on real QUIC) or as child processes (`serve`, for a real process death),
 * with fresh identities that trust each other; their counters (`Worker.stats()`, or the
 * StatsRequest message for a child); and bounded waits that fail with what was left.
 *
 * How these tests treat time, so that they pass on any machine (issue #7):
 * - compute (prefill, generation, recompute after a fault) is never timed: requests and waits
 *   on compute carry only `HANG_MS`, a watchdog that catches a true hang;
 * - a protocol reaction (a refusal, a dead peer noticed, state freed) is bounded by the
 *   configured timer that drives it plus `SCHEDULING_SLACK_MS`, or by the timer that would
 *   otherwise have ended the case, so the bound says which path was taken, not how fast the
 *   machine is. What happened is asserted by outcome (reasons, counters), not by duration.
 */
import { HELD_COUNTER_FIELDS } from "./messages.ts";
import assert from "node:assert/strict";
import { RUNTIME_DEFAULTS } from "./engine.ts";
import { type LocalWorker, makeTrustingNodes, startWorker, stopWorker } from "./local_cluster.ts";
import type { PeerAddress, WorkerCounters } from "./messages.ts";
import type { Node, NodeFaults } from "./node.ts";
import { Worker, type WorkerOptions } from "./worker.ts";
import { queryStats, withTimeout } from "./stats.ts";
import { HANG_MS } from "../testing/bounds.ts";
import { testModel } from "../testing/models.ts";

export { queryStats, withTimeout };
import type { PeerConnection } from "../transport/mod.ts";

/** Timing every test worker uses: short, so that every failure ends within seconds. */
export const TIMING = {
  reserveTimeoutMs: 1_500,
  commitTimeoutMs: 2_000,
  leaseMs: 3_000,
  creditStallMs: 2_000,
  reservationMs: 5_000,
  retriesMax: 2,
};
/** A silent peer is declared dead after this (both sides use it). */
export const IDLE_MS = 500;
export const COMMITTED_IDLE_MS = 2_000;

/** Watchdog for compute-bound work (a handoff's prefill and generation, a recompute). */
export { HANG_MS };
/**
 * Event-loop and scheduling delay a loaded two-core machine may add to a reaction that does
 * no compute. Added to configured timers; small next to the timer that would otherwise end
 * the case, so a bound with it still tells the two paths apart.
 */
export const SCHEDULING_SLACK_MS = 3_000;
/**
 * A refusal needs no timer: it must come before the reservation would have expired on its own
 * (the first timer that could otherwise end the case), whatever the machine.
 */
export const REFUSAL_BOUND_MS = TIMING.reservationMs;
/**
 * After an outcome, the longest timer that may still hold state (a reservation, a lease, an
 * unclaimed committed session) plus scheduling slack: workers must be back to zero by then.
 */
export const RELEASE_BOUND_MS = Math.max(TIMING.reservationMs, TIMING.leaseMs, COMMITTED_IDLE_MS) +
  SCHEDULING_SLACK_MS;
/** Small contexts, small chunks (many pages), one thread (two cores shared by everything). */
export const RUNTIME = { nCtx: 2048, chunkTokens: 64, threads: 1 };
export const SAMPLING = { temperature: 0, topK: 40, topP: 0.95, seed: 1 };

/** A prompt of roughly `sentences` x 11 tokens (no content that matters). */
export function promptOf(sentences: number): string {
  return "the quick brown fox jumps over the lazy dog and ".repeat(sentences);
}

/** A worker under test, in this process or a child process. */
export interface TestWorker {
  name: string;
  peer: PeerAddress;
  /** Set for an in-process worker. */
  worker?: Worker;
  /** Set for a child process. */
  child?: LocalWorker;
  stats(): Promise<WorkerCounters>;
  stop(): Promise<void>;
}

/**
 * Fresh identities in a temporary folder, each trusted in its role (LOCAL_ROLES, or `roles`);
 * `client` is the test's own node (a coordinator).
 */
export async function makeNodes(
  names: string[],
  roles: Parameters<typeof makeTrustingNodes>[2] = {},
): Promise<{ dir: string; nodes: Map<string, Node> }> {
  const dir = await Deno.makeTempDir({ prefix: "skippy-failures-" });
  return { dir, nodes: await makeTrustingNodes(dir, names, roles) };
}

/**
 * The tiny hybrid test model and fresh prefill, decode and client identities (`makeNodes`):
 * the setup most handoff tests start from; `client` is the test's own node.
 */
export async function hybridTrio(): Promise<
  { model: string; dir: string; nodes: Map<string, Node>; client: Node }
> {
  const model = await testModel("hybrid");
  const { dir, nodes } = await makeNodes(["prefill", "decode", "client"]);
  return { model, dir, nodes, client: nodes.get("client")! };
}

/** Starts a worker in this process with the test timing. */
export async function startInProcess(
  name: string,
  role: WorkerOptions["role"],
  stateDir: string,
  modelPath: string,
  options: Partial<WorkerOptions> & { faults?: NodeFaults } = {},
): Promise<TestWorker> {
  const worker = await Worker.start({
    role,
    hostname: "127.0.0.1",
    port: 0,
    runtime: { ...RUNTIME_DEFAULTS, ...RUNTIME, modelPath },
    stateDir,
    sessionsMax: 2,
    timing: TIMING,
    committedIdleMs: COMMITTED_IDLE_MS,
    // Loopback: no link worth measuring in the background (serve/link_loss.ts).
    linkProbeAgeMs: 0,
    // SKIPPY_TEST_LOG=1 shows the workers' log lines (never content) while debugging a test.
    log: Deno.env.get("SKIPPY_TEST_LOG") ? (line) => console.error(`${name}: ${line}`) : () => {},
    ...options,
    link: { maxIdleTimeoutMs: IDLE_MS, ...options.link },
  });
  const peer = { nodeId: worker.node.identity.nodeId, host: "127.0.0.1", port: worker.addr.port };
  return {
    name,
    peer,
    worker,
    stats: () => Promise.resolve(worker.stats()),
    stop: () => worker.close(),
  };
}

/** The `serve` flags that give a child process the same numerics and timing. */
export function childArgs(modelPath: string): string[] {
  return [
    "--model",
    modelPath,
    "--ctx",
    String(RUNTIME.nCtx),
    "--chunk-tokens",
    String(RUNTIME.chunkTokens),
    "--threads",
    String(RUNTIME.threads),
    "--max-idle-timeout-ms",
    String(IDLE_MS),
    "--lease-ms",
    String(TIMING.leaseMs),
    "--commit-timeout-ms",
    String(TIMING.commitTimeoutMs),
    "--reserve-timeout-ms",
    String(TIMING.reserveTimeoutMs),
    "--committed-idle-ms",
    String(COMMITTED_IDLE_MS),
  ];
}

/** Starts `serve` as a child process; its counters are read with StatsRequest by `client`. */
export async function startChild(
  name: string,
  role: string,
  stateDir: string,
  modelPath: string,
  client: Node,
  env?: Record<string, string>,
): Promise<TestWorker> {
  const child = await startWorker(role, stateDir, childArgs(modelPath), { env });
  let channel: PeerConnection | null = null;
  const stats = async () => {
    channel ??= await client.connect(child.peer);
    // The child may be inside a long synchronous call (an import); how fast it answers is
    // not what any test asserts, so the answer gets the release bound, not the 2 s default.
    return await queryStats(channel, RELEASE_BOUND_MS);
  };
  const stop = async () => {
    await channel?.close().catch(() => {});
    await stopWorker(child);
  };
  return { name, peer: child.peer, child, stats, stop };
}

/** Counters that must return to zero once nothing is running (the totals need not). */
export const HELD = HELD_COUNTER_FIELDS;

/**
 * Waits until every held counter of `w` is zero; returns how long that took. Fails with the
 * counters still held after `withinMs`.
 */
export async function waitForIdle(w: TestWorker, withinMs: number): Promise<number> {
  const t0 = performance.now();
  let last: WorkerCounters | null = null;
  while (performance.now() - t0 < withinMs) {
    last = await w.stats();
    if (HELD.every((k) => last![k] === 0)) return performance.now() - t0;
    await sleep(25);
  }
  const held = HELD.filter((k) => last && last[k] !== 0).map((k) => `${k}=${last![k]}`);
  throw new assert.AssertionError({
    message: `${w.name} still holds ${held.join(", ")} after ${withinMs} ms`,
  });
}

/** Waits until `predicate(stats)` holds (e.g. pages staged), polling every 10 ms. */
export async function waitForStats(
  w: TestWorker,
  predicate: (s: WorkerCounters) => boolean,
  withinMs: number,
  what: string,
): Promise<WorkerCounters> {
  const t0 = performance.now();
  while (performance.now() - t0 < withinMs) {
    const s = await w.stats();
    if (predicate(s)) return s;
    await sleep(10);
  }
  throw new Error(`${w.name}: ${what} did not happen within ${withinMs} ms`);
}

/** Runs `fn`, measuring how long it took to succeed or fail. */
export async function timed<T>(
  fn: () => Promise<T>,
): Promise<{ value?: T; error?: Error; ms: number }> {
  const t0 = performance.now();
  try {
    const value = await fn();
    return { value, ms: performance.now() - t0 };
  } catch (error) {
    return { error: error as Error, ms: performance.now() - t0 };
  }
}

/** Asserts `ms` is within the stated deadline, naming the case. */
export function assertWithin(ms: number, deadlineMs: number, what: string): void {
  if (Deno.env.get("SKIPPY_TEST_LOG")) {
    console.error(`measured: ${what}: ${ms.toFixed(0)} ms (deadline ${deadlineMs} ms)`);
  }
  assert.ok(ms <= deadlineMs, `${what} took ${ms.toFixed(0)} ms, deadline ${deadlineMs} ms`);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Resolves like `promise`, or rejects after `ms` naming `what`. */
