/**
 * The chaos run (issue #8): handoffs between a prefill and a decode worker, each a child
 * process on loopback, with one of them killed by SIGKILL at a seeded point of every trial,
 * alternating prefill and decode. The kill lands at an exact protocol step through a named
 * fault point (serve/fault_points.ts: the process kills itself there), or before the request
 * is sent. The killed worker is restarted (same identity and port) before the next trial.
 *
 * Each trial checks: the request completes with tokens equal to local generation (greedy or
 * seeded sampling, alternating), or, only when no node could serve, ends with a clear error
 * within the stated deadline; and the survivor's held counters (retained and staged bytes,
 * sessions, contexts) return to zero within `releaseMs`. A last trial kills both workers: the
 * request must fail with NoNodeLeftError within `noNodeDeadlineMs`.
 */
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { NoNodeLeftError, runHandoff } from "../serve/coordinator.ts";
import { Engine, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { FAULT_ENV } from "../serve/fault_points.ts";
import {
  type LocalWorker,
  makeTrustingNodes,
  startWorker,
  stopWorker,
} from "../serve/local_cluster.ts";
import { HELD_COUNTER_FIELDS, type SamplingSpec, type WorkerCounters } from "../serve/messages.ts";
import { Node } from "../serve/node.ts";
import { queryStats } from "../serve/stats.ts";
import { seededRandom } from "../transport/mod.ts";

export type Victim = "prefill" | "decode";
/** Where a trial kills its victim. */
export type KillPoint = "before-request" | "mid-stream" | "after-first-token" | "mid-generation";

/** The points each victim can die at (a prefill worker does no generation of its own). */
export const KILL_POINTS: Record<Victim, readonly KillPoint[]> = {
  prefill: ["before-request", "mid-stream", "after-first-token"],
  decode: ["before-request", "mid-stream", "mid-generation"],
};

export interface ChaosOptions {
  trials: number;
  seed: number;
  modelPath: string;
  /** Prompt length, in tokens (about). */
  promptTokens: number;
  generateTokens: number;
  /** Prefill chunk (and KV page) size: small, so a mid-stream kill has pages to land between. */
  chunkTokens: number;
  threads: number;
  /** Link idle timeout on every node: how fast a dead peer is noticed. */
  maxIdleTimeoutMs: number;
  /** Coordinator: connect bound per candidate node. */
  connectTimeoutMs: number;
  /** Watchdog per request (compute is never timed): only a true hang trips it. */
  hangMs: number;
  /** After an outcome, the survivor's held counters must be zero within this. */
  releaseMs: number;
  log?: (line: string) => void;
}

export const CHAOS_DEFAULTS = {
  trials: 12,
  seed: 1,
  promptTokens: 600,
  generateTokens: 64,
  chunkTokens: 64,
  threads: 1,
  maxIdleTimeoutMs: 500,
  connectTimeoutMs: 1_000,
  hangMs: 600_000,
  releaseMs: 15_000,
} as const;

/**
 * When every node is dead: each dead link is noticed within the idle timeout (the prefill
 * worker's, then the decode worker's), each candidate tried again costs at most the connect
 * bound, plus scheduling slack.
 */
export function noNodeDeadlineMs(o: Pick<ChaosOptions, "maxIdleTimeoutMs" | "connectTimeoutMs">) {
  return 2 * o.maxIdleTimeoutMs + 2 * o.connectTimeoutMs + 3_000;
}

export interface ChaosTrial {
  index: number;
  victim: Victim | "both";
  point: KillPoint;
  /** The fault point armed (`point:n`), or null for a kill from outside. */
  fault: string | null;
  sampling: "greedy" | "seeded";
  /** `completed`, or `error` (then `error` says why). */
  outcome: "completed" | "error";
  placement: string | null;
  /** Fallback kinds taken, in order, each with the tokens the client had then (`kind@n`). */
  fallbacks: string[];
  completedBy: string | null;
  /** Tokens equal to local generation (null when the request failed). */
  equal: boolean | null;
  error: string | null;
  /** Coordinator's clock, request start to outcome. */
  ms: number;
  /** The survivor's held counters after the outcome (null: no survivor). */
  survivorHeld: Partial<WorkerCounters> | null;
  ok: boolean;
}

const GREEDY: SamplingSpec = { temperature: 0, topK: 40, topP: 0.95, seed: 1 };
const SENTENCE = "the quick brown fox jumps over the lazy dog and ";
const HELD = HELD_COUNTER_FIELDS;

interface Cluster {
  dir: string;
  client: Node;
  workers: Record<Victim, LocalWorker>;
  ports: Record<Victim, number>;
  args: string[];
}

/** Runs the trials; never throws for a trial's failure (see each trial's `ok`). */
export async function runChaos(o: ChaosOptions): Promise<ChaosTrial[]> {
  const log = o.log ?? (() => {});
  const random = seededRandom(o.seed);
  const prompt = await promptOf(o.modelPath, o.promptTokens);
  const seeded: SamplingSpec = { temperature: 0.8, topK: 40, topP: 0.95, seed: o.seed };
  const local = {
    greedy: await localTokens(o, prompt, GREEDY),
    seeded: await localTokens(o, prompt, seeded),
  };
  const pages = Math.max(2, Math.floor(o.promptTokens / o.chunkTokens));
  const order = {
    prefill: shuffled(KILL_POINTS.prefill, random),
    decode: shuffled(KILL_POINTS.decode, random),
  };
  const cluster = await startCluster(o);
  const trials: ChaosTrial[] = [];
  try {
    for (let i = 0; i < o.trials; i++) {
      const victim: Victim = i % 2 === 0 ? "prefill" : "decode";
      // Each victim goes through its points in a seeded order, so every point is hit.
      const points = order[victim];
      const point = points[Math.floor(i / 2) % points.length];
      const kind = i % 4 < 2 ? "greedy" : "seeded";
      const fault = faultFor(victim, point, random, pages, o.generateTokens);
      log(`trial ${i + 1}/${o.trials}: kill ${victim} ${point}${fault ? ` (${fault})` : ""}`);
      const trial = await runTrial(cluster, o, {
        index: i + 1,
        victim,
        point,
        fault,
        sampling: kind,
        spec: kind === "greedy" ? GREEDY : seeded,
        prompt,
        expected: local[kind],
      });
      trials.push(trial);
      log(`  ${formatTrial(trial)}`);
      await restart(cluster, victim, null); // the killed worker comes back for the next trial
    }
    trials.push(await bothDead(cluster, o, prompt, trials.length + 1));
    log(`  ${formatTrial(trials.at(-1)!)}`);
  } finally {
    await cluster.client.close();
    await Promise.allSettled([
      stopWorker(cluster.workers.prefill),
      stopWorker(cluster.workers.decode),
    ]);
    await Deno.remove(cluster.dir, { recursive: true }).catch(() => {});
  }
  return trials;
}

function shuffled<T>(items: readonly T[], random: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/** The fault point that kills `victim` at `point` (null: killed from outside, before the request). */
function faultFor(
  victim: Victim,
  point: KillPoint,
  random: () => number,
  pages: number,
  generateTokens: number,
): string | null {
  const pick = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  if (point === "before-request") return null;
  if (point === "after-first-token") return "first-token-sent:1";
  if (point === "mid-stream") {
    // Between the first and the last page: the state is partly across.
    const n = pick(1, pages - 1);
    return victim === "prefill" ? `prefill-chunk-sent:${n}` : `decode-chunk-received:${n}`;
  }
  // Mid-generation: after the commit, once one or more token batches (up to 16 tokens
  // each) reached the client, while more are due.
  return `token-batch-sent:${pick(1, Math.max(1, Math.floor((generateTokens - 2) / 16)))}`;
}

interface TrialSpec {
  index: number;
  victim: Victim;
  point: KillPoint;
  fault: string | null;
  sampling: "greedy" | "seeded";
  spec: SamplingSpec;
  prompt: string;
  expected: number[];
}

async function runTrial(c: Cluster, o: ChaosOptions, t: TrialSpec): Promise<ChaosTrial> {
  await restart(c, t.victim, t.fault);
  if (t.point === "before-request") await kill(c.workers[t.victim]);
  const survivor: Victim = t.victim === "prefill" ? "decode" : "prefill";
  const t0 = performance.now();
  const base = {
    index: t.index,
    victim: t.victim,
    point: t.point,
    fault: t.fault,
    sampling: t.sampling,
  };
  let trial: ChaosTrial;
  try {
    const r = await runHandoff(c.client, request(c, o, t.prompt, t.spec));
    const equal = r.tokens.length === t.expected.length &&
      r.tokens.every((tok, i) => tok === t.expected[i]);
    trial = {
      ...base,
      outcome: "completed",
      placement: r.placement,
      fallbacks: r.fallbacks.map((f) => `${f.kind}@${f.tokensBefore}`),
      completedBy: r.completedBy.role,
      equal,
      error: null,
      ms: performance.now() - t0,
      survivorHeld: null,
      ok: equal,
    };
  } catch (error) {
    trial = {
      ...base,
      outcome: "error",
      placement: null,
      fallbacks: [],
      completedBy: null,
      equal: null,
      error: (error as Error).message,
      ms: performance.now() - t0,
      survivorHeld: null,
      ok: false, // a survivor was left: the request had to complete
    };
  }
  // The victim is dead by now unless its fault point was never reached: make sure.
  await kill(c.workers[t.victim]);
  trial.survivorHeld = await heldAfter(c, survivor, o.releaseMs);
  const released = Object.values(trial.survivorHeld).every((v) => v === 0);
  trial.ok = trial.ok && released;
  return trial;
}

/** Both workers killed: the request must fail with a clear error within the deadline. */
async function bothDead(
  c: Cluster,
  o: ChaosOptions,
  prompt: string,
  index: number,
): Promise<ChaosTrial> {
  await Promise.all([kill(c.workers.prefill), kill(c.workers.decode)]);
  const t0 = performance.now();
  const base = {
    index,
    victim: "both" as const,
    point: "before-request" as const,
    fault: null,
    sampling: "greedy" as const,
  };
  try {
    const r = await runHandoff(c.client, request(c, o, prompt, GREEDY));
    return {
      ...base,
      outcome: "completed",
      placement: r.placement,
      fallbacks: r.fallbacks.map((f) => f.kind),
      completedBy: r.completedBy.role,
      equal: null,
      error: null,
      ms: performance.now() - t0,
      survivorHeld: null,
      ok: false, // no node was alive: completing is impossible, so something is wrong
    };
  } catch (error) {
    const ms = performance.now() - t0;
    return {
      ...base,
      outcome: "error",
      placement: null,
      fallbacks: [],
      completedBy: null,
      equal: null,
      error: (error as Error).message,
      ms,
      survivorHeld: null,
      ok: error instanceof NoNodeLeftError && ms <= noNodeDeadlineMs(o),
    };
  }
}

function request(c: Cluster, o: ChaosOptions, prompt: string, sampling: SamplingSpec) {
  return {
    prefill: c.workers.prefill.peer,
    decode: c.workers.decode.peer,
    prompt,
    generateTokens: o.generateTokens,
    sampling,
    tenantId: "chaos",
    probe: false,
    timeoutMs: o.hangMs,
  };
}

async function startCluster(o: ChaosOptions): Promise<Cluster> {
  const dir = await Deno.makeTempDir({ prefix: "skippy-chaos-" });
  await makeTrustingNodes(dir, ["prefill", "decode", "client"]);
  const client = await Node.open(`${dir}/client`, {
    maxIdleTimeoutMs: o.maxIdleTimeoutMs,
    peerLinks: { connectTimeoutMs: o.connectTimeoutMs },
  });
  const nCtx = Math.ceil((o.promptTokens * 1.2 + o.generateTokens + 64) / 256) * 256;
  const args = [
    "--model",
    o.modelPath,
    "--ctx",
    String(nCtx),
    "--chunk-tokens",
    String(o.chunkTokens),
    "--threads",
    String(o.threads),
    "--max-idle-timeout-ms",
    String(o.maxIdleTimeoutMs),
    "--reserve-timeout-ms",
    "1500",
    "--commit-timeout-ms",
    "2000",
    "--lease-ms",
    "3000",
    "--committed-idle-ms",
    "2000",
  ];
  const [prefill, decode] = await Promise.all([
    startWorker("prefill", `${dir}/prefill`, args),
    startWorker("decode", `${dir}/decode`, args),
  ]);
  return {
    dir,
    client,
    workers: { prefill, decode },
    ports: { prefill: prefill.peer.port, decode: decode.peer.port },
    args,
  };
}

/** Stops `victim` if running and starts it again (same identity and port), armed with `fault`. */
async function restart(c: Cluster, victim: Victim, fault: string | null) {
  const old = c.workers[victim];
  await stopWorker(old, 3_000);
  const env = fault ? { [FAULT_ENV]: fault } : undefined;
  c.workers[victim] = await startWorker(victim, old.stateDir, c.args, {
    listen: `127.0.0.1:${c.ports[victim]}`,
    env,
  });
  // The coordinator is told it is back (as a peers file would): no backoff to wait out.
  c.client.links.forget(c.workers[victim].peer);
}

/** SIGKILL, and wait for the process to be gone. */
async function kill(w: LocalWorker): Promise<void> {
  try {
    w.process.kill("SIGKILL");
  } catch { /* already gone */ }
  await w.process.status;
}

/** The survivor's held counters once they are all zero, or as they are after `withinMs`. */
async function heldAfter(c: Cluster, who: Victim, withinMs: number) {
  const conn = await c.client.connect(c.workers[who].peer);
  const t0 = performance.now();
  let held: Partial<WorkerCounters> = {};
  try {
    while (performance.now() - t0 < withinMs) {
      const s = await queryStats(conn, withinMs);
      held = Object.fromEntries(HELD.map((k) => [k, s[k]]));
      if (HELD.every((k) => s[k] === 0)) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    await conn.close().catch(() => {});
  }
  return held;
}

async function promptOf(model: string, tokens: number): Promise<string> {
  using m = await LlamaModel.load(loadLlama(), model);
  const perSentence = m.vocab.tokenize(SENTENCE.repeat(100), false).length / 100;
  return SENTENCE.repeat(Math.max(1, Math.floor((tokens - 2) / perSentence)));
}

/** Local generation, same numerics as the workers: what every trial must reproduce. */
async function localTokens(o: ChaosOptions, prompt: string, s: SamplingSpec): Promise<number[]> {
  using engine = await Engine.open({
    ...RUNTIME_DEFAULTS,
    modelPath: o.modelPath,
    nCtx: Math.ceil((o.promptTokens * 1.2 + o.generateTokens + 64) / 256) * 256,
    chunkTokens: o.chunkTokens,
    threads: o.threads,
  });
  const tokens = engine.model.vocab.tokenize(prompt);
  const logits = await engine.prefill(tokens);
  const { seed, ...params } = s;
  const out: number[] = [];
  for await (const step of engine.generate(logits, o.generateTokens, params, { seed, draws: 0 })) {
    out.push(step.token);
  }
  return out;
}

/** One line per trial (no content). */
export function formatTrial(t: ChaosTrial): string {
  const where = `${t.victim} ${t.point}${t.fault ? ` [${t.fault}]` : ""}`;
  const what = t.outcome === "completed"
    ? `completed ${t.placement} by ${t.completedBy}` +
      (t.fallbacks.length ? ` via ${t.fallbacks.join(" > ")}` : "")
    : `error: ${t.error}`;
  const held = t.survivorHeld
    ? ` survivor ${
      Object.values(t.survivorHeld).every((v) => v === 0) ? "idle" : JSON.stringify(t.survivorHeld)
    }`
    : "";
  const equal = t.equal === null ? "" : ` equal ${t.equal ? "yes" : "NO"}`;
  return `#${t.index} ${t.sampling} kill ${where}: ${what}${equal} (${t.ms.toFixed(0)} ms)${held} ${
    t.ok ? "OK" : "FAIL"
  }`;
}
