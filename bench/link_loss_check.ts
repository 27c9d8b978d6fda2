/**
 * A live node's loss measurement (transport/link_monitor.ts `measure()`: pings, the 8 MiB
 * bandwidth probe, then the datagram loss probe) through the link emulator, at each rate, RTT
 * and loss, `--repeats` times on a fresh connection through a fresh relay (its own loss seed
 * each time): the loss the pings read beside the loss the datagrams read, and whether the
 * planner's loss rule (`lossFractionMax`) would refuse the link. It answers whether a node can
 * tell a 0.1%-loss link from a clean one. Two workers on loopback (`super-mini`, idle); the
 * decode worker sits behind the relay, and this process measures it on the prefill worker's
 * behalf, as the link matrix does.
 *
 *   deno run -A --unstable-net bench/link_loss_check.ts [--rates 100,400,1000] [--rtts 0.2,2,10]
 *     [--losses 0,0.001] [--repeats 3]
 *
 * @module
 */

import { benchArgs, numberList, orExit, wholeNumber } from "./cli_args.ts";
import { DEFAULT_PLAN_OPTIONS } from "../core/planner.ts";
import { countUdpReceiveDrops } from "../transport/mod.ts";
import { startRelayCheck, throughRelay } from "./_relay_check.ts";

if (import.meta.main) {
  const values = benchArgs("link_loss_check.ts", {
    rates: { default: "100,400,1000", what: "Mbit/s" },
    rtts: { default: "0.2,2,10", what: "ms" },
    losses: { default: "0,0.001", what: "fractions" },
    repeats: { default: "3" },
  });
  const repeats = orExit(() => wholeNumber("--repeats", values.repeats, 1, 100));
  const check = await startRelayCheck();
  const { ceiling, cluster } = check;
  const max = DEFAULT_PLAN_OPTIONS.lossFractionMax;
  const pct = (x: number | null | undefined) => x == null ? "-" : `${(x * 100).toFixed(3)}%`;
  let wrong = 0, total = 0;
  try {
    for (const rate of numberList("--rates", values.rates)) {
      for (const rttMs of numberList("--rtts", values.rtts)) {
        for (const loss of numberList("--losses", values.losses)) {
          const read: string[] = [];
          for (let rep = 0; rep < repeats; rep++) {
            const point = { rateBitsPerS: rate * 1e6, rttMs, lossFraction: loss };
            const { conn, monitor, close } = await throughRelay(check, point, 101 + rep);
            try {
              const drops = await countUdpReceiveDrops();
              await monitor.measureRate(conn);
              const pings = monitor.estimate(monitor.pairTo(conn));
              const t0 = performance.now();
              const r = await monitor.probeLoss(conn).catch((e) => (e as Error).message);
              const ms = performance.now() - t0;
              const udp = await drops();
              if (typeof r === "string" || r === null) {
                read.push(`failed (${r ?? "not run"})`);
                continue;
              }
              const refused = r.lossFraction > max;
              total++;
              if (refused !== loss > max) wrong++;
              read.push(
                `pings ${pct(pings?.lossFraction)} datagrams ${pct(r.lossFraction)} ` +
                  `(${r.sent - r.received}/${r.sent} lost in ${r.lossEvents} events, ` +
                  `${ms.toFixed(0)} ms, host drops ${udp.receiveDrops ?? "?"})` +
                  (refused ? " refused" : ""),
              );
            } finally {
              await close();
            }
          }
          console.log(`${rate}M ${rttMs}ms loss ${pct(loss)}: ${read.join("; ")}`);
        }
      }
    }
    console.log(
      `relay native, ceiling ${Math.round(ceiling.bitsPerS / 1e6)} Mbit/s; lossFractionMax ` +
        `${pct(max)}: the loss probe decided ${total - wrong} of ${total} links as the emulated ` +
        `loss would`,
    );
  } finally {
    await cluster.stop();
  }
}
