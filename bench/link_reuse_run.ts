/**
 * What a handoff costs end to end on two loopback workers (child processes, tiny hybrid model):
 * the coordinator's time to first token, the request's end-to-end time, and the prefiller's
 * reservation round trip, sequential and at a small concurrency. Written to run unchanged on
 * any checkout with `runHandoff` and `startLocalCluster`, so a tree with a connection per
 * handoff and one with a shared link per decode peer (issue #9) can be run alternately and
 * compared side by side. Prints one JSON line; never asserted.
 *
 *     deno run -A --unstable-net bench/link_reuse_run.ts [--requests 12] [--concurrency 2]
 */
import { runHandoff } from "../serve/coordinator.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { testModel } from "../testing/models.ts";

function intArg(name: string, fallback: number): number {
  const i = Deno.args.indexOf(name);
  if (i < 0) return fallback;
  const v = Number(Deno.args[i + 1]);
  if (!Number.isInteger(v) || v < 1) {
    console.error(`error: ${name} must be a positive integer (got "${Deno.args[i + 1]}")`);
    Deno.exit(2);
  }
  return v;
}
if (Deno.args.includes("--help")) {
  console.log(
    "usage: deno run -A --unstable-net bench/link_reuse_run.ts [--requests N] [--concurrency C]",
  );
  Deno.exit(0);
}
const requests = intArg("--requests", 12);
const concurrency = intArg("--concurrency", 2);

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor((s.length - 1) / 2)];
};

const model = await testModel("hybrid");
const cluster = await startLocalCluster({ args: ["--model", model] });
try {
  const one = async () => {
    const r = await runHandoff(cluster.client, {
      prefill: cluster.prefill.peer,
      decode: cluster.decode.peer,
      prompt: "the quick brown fox jumps over the lazy dog and ".repeat(12),
      generateTokens: 4,
      sampling: { temperature: 0, topK: 40, topP: 0.95, seed: 1 },
      tenantId: "bench",
      probe: false,
      timeoutMs: 600_000,
    });
    if (r.placement !== "disaggregated") throw new Error(`fell back: ${r.fallbackReason}`);
    const t = r.telemetry as unknown as Record<string, number | null>;
    return { ttftMs: r.ttftMs, e2eMs: r.e2eMs, commitRoundTripMs: t.commitRoundTripMs ?? NaN };
  };
  await one(); // warm-up: model pages, first links
  const sequential = [];
  for (let i = 0; i < requests; i++) sequential.push(await one());
  const concurrent = [];
  for (let i = 0; i < requests; i += concurrency) {
    concurrent.push(...await Promise.all(Array.from({ length: concurrency }, one)));
  }
  const summary = (rs: Awaited<ReturnType<typeof one>>[]) => ({
    ttftMsMedian: Number(median(rs.map((r) => r.ttftMs)).toFixed(1)),
    e2eMsMedian: Number(median(rs.map((r) => r.e2eMs)).toFixed(1)),
    commitRoundTripMsMedian: Number(median(rs.map((r) => r.commitRoundTripMs)).toFixed(1)),
  });
  // What a connection per handoff put on each handoff's path: connect and authenticate.
  const connects: number[] = [];
  for (let i = 0; i < requests; i++) {
    const t0 = performance.now();
    const conn = await cluster.client.connect(cluster.decode.peer);
    connects.push(performance.now() - t0);
    await conn.close();
  }
  console.log(JSON.stringify({
    requests,
    concurrency,
    connectMsMedian: Number(median(connects).toFixed(1)),
    sequential: summary(sequential),
    concurrent: summary(concurrent),
  }));
} finally {
  await cluster.stop();
}
