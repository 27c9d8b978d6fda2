/**
 * `serve --congestion-control auto` end to end, as a user runs it: two workers (child
 * processes) with their default link measurement, and one emulated link between them (the
 * native relay). Over a lossy link the first handoff goes with Cubic, the prefill worker's
 * own loss probe after it finds loss, and the next handoffs go over a BBR connection; over a
 * clean link every handoff stays with Cubic. Each link gets a fresh pair of workers. Prints
 * each handoff's tail and the controller it went with, and the prefill worker's log line for
 * the switch. Tails are printed, never asserted; the run exits 1 when a handoff failed or fell
 * back, or the controller did not follow the link (a functional check).
 *
 *     deno run -A --unstable-net bench/cc_auto_check.ts [--model super-mini] [--prompt-tokens 512]
 *       [--rate 400] [--rtt 10] [--loss 0.001] [--handoffs 6]
 */
import { cacheDir } from "../cli/paths.ts";
import { ensureModelFile } from "../models/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { type LocalCluster, startLocalCluster } from "../serve/local_cluster.ts";
import { benchArgs, numberList } from "./cli_args.ts";
import { baseHandoffRequest, promptsOfTokens } from "./link_bench.ts";
import { MATRIX_MODELS } from "./_matrix_point.ts";
import { buildNativeRelay, measureNativeCeiling, openGridLink } from "./native_relay.ts";

/** How long to wait for the prefill worker's link measurement after the first handoff. */
const PROBE_WAIT_MS = 60_000;

interface Handoff {
  /** The controller the handoff's connection sent with. */
  sentWith: string;
  tailMs: number | null;
  placement: string;
}

interface LinkRun {
  lossFraction: number;
  handoffs: Handoff[];
  /** The prefill worker's log lines about the link (measurement, switch). */
  linkLines: string[];
}

async function runLink(
  model: string,
  o: {
    promptTokens: number;
    promptFor: (n: number) => string;
    rateBitsPerS: number;
    rttMs: number;
    handoffs: number;
  },
  lossFraction: number,
  relay: { binary: string | null; ceilingBitsPerS: number },
): Promise<LinkRun> {
  // The workers' defaults: auto, and the prefill worker measuring a decoder's link after a
  // handoff (once per 20 s).
  const cluster = await startLocalCluster({
    args: ["--model", model, "--ctx", String(o.promptTokens + 512)],
    prefillArgs: ["--link-probe-age-ms", "20000"],
  });
  const point = { rateBitsPerS: o.rateBitsPerS, rttMs: o.rttMs, lossFraction };
  const link = await openGridLink(relay.binary, cluster.decode.peer, point, {
    ceilingBitsPerS: relay.ceilingBitsPerS,
    seed: 7,
  });
  try {
    const via = { ...cluster.decode.peer, host: link.endpoint.hostname, port: link.endpoint.port };
    const request = {
      ...baseHandoffRequest(cluster, 600_000),
      decode: via,
      prompt: o.promptFor(o.promptTokens),
    };
    const handoffs: Handoff[] = [];
    // A reported switch applies from the next handoff on (a new connection).
    let next = "cubic";
    for (let i = 0; i < o.handoffs; i++) {
      const r = await runHandoff(cluster.client, request);
      handoffs.push({
        sentWith: next,
        tailMs: r.telemetry?.uncoveredTailMs ?? null,
        placement: r.placement === "disaggregated"
          ? "disaggregated"
          : `${r.placement}: ${r.fallbackReason}`,
      });
      next = r.linkLoss?.congestionControl ?? next;
      if (i === 0) next = await _probed(cluster) ?? next;
    }
    const linkLines = cluster.prefill.log.filter((l) => /link to decode worker/.test(l));
    return { lossFraction, handoffs, linkLines };
  } finally {
    link.close();
    await cluster.stop();
  }
}

/**
 * Waits for the prefill worker's measurement after the first handoff; the controller the next
 * handoff goes with when it switched, else null.
 */
async function _probed(cluster: LocalCluster): Promise<string | null> {
  const done = /datagrams lost|loss probe not run|measurement failed/;
  const until = performance.now() + PROBE_WAIT_MS;
  while (performance.now() < until && !cluster.prefill.log.some((l) => done.test(l))) {
    await new Promise((r) => setTimeout(r, 100));
  }
  await new Promise((r) => setTimeout(r, 100)); // the switch's line follows the probe's
  const sw = cluster.prefill.log.find((l) => /new handoffs go over a (BBR|Cubic)/.test(l));
  return sw ? (/BBR/.test(sw) ? "bbr" : "cubic") : null;
}

function _report(run: LinkRun): boolean {
  const lossy = run.lossFraction > 0;
  console.log(`\nlink with ${(run.lossFraction * 100).toFixed(2)}% loss:`);
  for (const [i, h] of run.handoffs.entries()) {
    console.log(
      `  handoff ${i + 1}: ${h.placement}, sent with ${h.sentWith}, tail ${
        h.tailMs === null ? "n/a" : `${h.tailMs.toFixed(0)} ms`
      }`,
    );
  }
  for (const l of run.linkLines) console.log(`  prefill worker: ${l}`);
  const failed = run.handoffs.filter((h) => h.placement !== "disaggregated").length;
  const later = run.handoffs.slice(1).map((h) => h.sentWith);
  const want = lossy ? "bbr" : "cubic";
  const followed = run.handoffs[0]?.sentWith === "cubic" && later.every((c) => c === want);
  console.log(
    `  ${failed === 0 ? "every handoff committed" : `${failed} handoffs did not commit`}; ` +
      `${
        followed
          ? `the handoffs after the first went with ${want}, as the link's loss says`
          : `the controller did not follow the link (wanted ${want} after the first)`
      }`,
  );
  return failed === 0 && followed;
}

if (import.meta.main) {
  const v = benchArgs("cc_auto_check.ts", {
    model: { default: "super-mini", what: "super-mini|lab-state" },
    "prompt-tokens": { default: "512" },
    rate: { default: "400", what: "Mbit/s" },
    rtt: { default: "10", what: "ms" },
    loss: { default: "0.001" },
    handoffs: { default: "6" },
  });
  const name = v.model as keyof typeof MATRIX_MODELS;
  if (!MATRIX_MODELS[name]) {
    console.error(`error: unknown --model ${v.model} (use super-mini or lab-state)`);
    Deno.exit(2);
  }
  const handoffs = numberList("--handoffs", v.handoffs)[0];
  const loss = numberList("--loss", v.loss)[0];
  if (!(handoffs >= 2) || !(loss > 0 && loss < 1)) {
    console.error("error: use --handoffs 2 or more and a --loss in (0, 1)");
    Deno.exit(2);
  }
  const model = await ensureModelFile(`${cacheDir()}/models`, MATRIX_MODELS[name]);
  const binary = await buildNativeRelay();
  const ceiling = binary ? await measureNativeCeiling(binary) : null;
  const relay = { binary, ceilingBitsPerS: ceiling?.bitsPerS ?? 40e6 };
  const o = {
    promptTokens: numberList("--prompt-tokens", v["prompt-tokens"])[0],
    promptFor: await promptsOfTokens(model),
    rateBitsPerS: numberList("--rate", v.rate)[0] * 1e6,
    rttMs: numberList("--rtt", v.rtt)[0],
    handoffs,
  };
  console.log(
    `${name}, ${o.promptTokens} tokens, ${o.rateBitsPerS / 1e6} Mbit/s, RTT ${o.rttMs} ms; ` +
      `workers with --congestion-control auto`,
  );
  let ok = true;
  for (const l of [loss, 0]) ok = _report(await runLink(model, o, l, relay)) && ok;
  Deno.exit(ok ? 0 : 1);
}
