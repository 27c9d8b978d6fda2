/**
 * The `link` section's mid-run degradation (link_bench.ts): a link that turns slow while a
 * request is in flight, how soon the link estimate flags it, and what happens to the request.
 */
import { runHandoff } from "../serve/coordinator.ts";
import type { HandoffRequest } from "../serve/coordinator.ts";
import type { LocalCluster } from "../serve/local_cluster.ts";
import { LinkEstimator } from "../core/link_estimates.ts";
import { LinkMonitor } from "../transport/link_monitor.ts";
import { type EmulatedLink, openLink } from "./native_relay.ts";

/** What the mid-run degradation showed. */
export interface DegradeResult {
  fromRttMs: number;
  toRttMs: number;
  pingIntervalMs: number;
  /** Link change to the estimate flagging it (new requests refused from then on). */
  detectMs: number | null;
  /** The stated bound: `recentSamples` pings, each up to an interval plus the new RTT. */
  boundMs: number;
  /** The request started as the link degraded: it completed (never failed). */
  inFlightPlacement: string | null;
  inFlightError: string | null;
  decisionAfter: string[];
}

/**
 * A 10 Mbit/s link whose RTT goes from 2 to 40 ms while pings run every 100 ms: how soon the
 * estimate flags it, and whether the request in flight then completes. Null where the relay
 * refuses the rate.
 */
export async function runDegrade(
  cluster: LocalCluster,
  ceilingBitsPerS: number,
  relayBinary: string | null,
  base: HandoffRequest,
): Promise<DegradeResult | null> {
  const rate = 10e6, pingIntervalMs = 100, fromRttMs = 2, toRttMs = 40;
  const decode = cluster.decode.peer;
  let link: EmulatedLink;
  try {
    link = await openLink(relayBinary, {
      target: { hostname: decode.host, port: decode.port },
      rateBitsPerS: rate,
      oneWayDelayMs: fromRttMs / 2,
      lossFraction: 0,
      queueBytesMax: 64 * 1024,
      ceilingBitsPerS,
    });
  } catch {
    return null;
  }
  const via = { ...decode, host: link.endpoint.hostname, port: link.endpoint.port };
  const links = new LinkEstimator();
  const pair = { from: cluster.prefill.peer.nodeId, to: decode.nodeId };
  const monitor = new LinkMonitor(pair.from, links, { pingIntervalMs });
  const conn = await cluster.client.connect(via);
  const stop = monitor.watch(conn);
  try {
    for (
      let k = 0;
      k < 200 && (links.estimate(pair, performance.now())?.rttSamples ?? 0) < 6;
      k++
    ) {
      await new Promise((r) => setTimeout(r, 25));
    }
    const t0 = performance.now();
    await link.reshape({ oneWayDelayMs: toRttMs / 2 });
    const inFlight = runHandoff(cluster.client, { ...base, decode: via }).then(
      (r) => ({ placement: r.placement, error: null }),
      (e) => ({ placement: null, error: (e as Error).message }),
    );
    let detectMs: number | null = null;
    for (let k = 0; k < 500 && detectMs === null; k++) {
      if (links.estimate(pair, performance.now())?.degraded) detectMs = performance.now() - t0;
      else await new Promise((r) => setTimeout(r, 10));
    }
    const r = await inFlight;
    const e = links.estimate(pair, performance.now());
    return {
      fromRttMs,
      toRttMs,
      pingIntervalMs,
      detectMs,
      boundMs: links.options.recentSamples * (pingIntervalMs + toRttMs) + toRttMs,
      inFlightPlacement: r.placement,
      inFlightError: r.error,
      decisionAfter: e?.degraded ? [e.degraded.code] : [],
    };
  } finally {
    stop();
    await conn.close();
    link.close();
  }
}
