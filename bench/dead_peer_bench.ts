/**
 * What a dead prefill worker costs a request (issue #8, "dead peers noticed fast"): two workers
 * on loopback, a few healthy requests (disaggregated, then colocated as the baseline), then the
 * prefill worker killed (SIGKILL) and requests sent on: the first notices the death through the
 * link's idle timeout, the next ones skip the known-dead peer and cost what colocated costs.
 * Prints one line per request; never asserted.
 *
 *     deno run -A --unstable-net bench/dead_peer_bench.ts [--idle-ms 500]
 */
import { runHandoff } from "../serve/coordinator.ts";
import { clusterRequest } from "./cluster_request.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { testModel } from "../testing/models.ts";

const idleArg = Deno.args.indexOf("--idle-ms");
if (Deno.args.includes("--help") || (idleArg < 0 && Deno.args.length > 0)) {
  console.log("usage: deno run -A --unstable-net bench/dead_peer_bench.ts [--idle-ms <ms>]");
  Deno.exit(Deno.args.includes("--help") ? 0 : 2);
}
const idleMs = idleArg >= 0 ? Number(Deno.args[idleArg + 1]) : 500;
if (!Number.isInteger(idleMs) || idleMs < 50) {
  console.error(
    `error: --idle-ms must be an integer of at least 50 (got "${Deno.args[idleArg + 1]}")`,
  );
  Deno.exit(2);
}
const model = await testModel("hybrid");
const cluster = await startLocalCluster({
  args: ["--model", model, "--max-idle-timeout-ms", String(idleMs)],
});
try {
  const run = async (label: string, colocated = false) => {
    const t0 = performance.now();
    const prompt = "the quick brown fox jumps over the lazy dog and ".repeat(20);
    const r = await runHandoff(
      cluster.client,
      clusterRequest(cluster, prompt, { generateTokens: 16, colocated }),
    );
    const ms = (performance.now() - t0).toFixed(0);
    const via = r.fallbacks.map((f) => f.kind).join(", ") || "-";
    console.log(`${label.padEnd(40)} ${ms.padStart(6)} ms  ${r.placement}  fallbacks: ${via}`);
  };
  for (let i = 0; i < 3; i++) await run("healthy, disaggregated");
  for (let i = 0; i < 3; i++) await run("healthy, colocated (baseline)", true);
  cluster.prefill.process.kill("SIGKILL");
  await cluster.prefill.process.status;
  await run("prefill just killed (link not aware)");
  for (let i = 0; i < 3; i++) await run("prefill known dead");
} finally {
  await cluster.stop();
}
