/**
 * A live node's bandwidth probe (transport/link_probe.ts) through the link emulator, probe
 * sizes side by side: per rate and RTT (lossless), each size probed `--repeats` times on a
 * fresh connection through a fresh relay, and the estimates printed. It answers whether a
 * probe of that size reads the emulated rate, the input every link term of the cost model
 * scales with. Two workers on loopback (`super-mini`, idle); the decode worker sits behind the
 * relay, and this process probes it on the prefill worker's behalf, as the link matrix does.
 *
 *   deno run -A --unstable-net bench/link_probe_check.ts [--rates 100,400,1000] [--rtts 0.2,2]
 *     [--mib 3,8] [--repeats 5]
 *
 * @module
 */

import { benchArgs, numberList, orExit, wholeNumber } from "./cli_args.ts";
import { startRelayCheck, throughRelay } from "./_relay_check.ts";

if (import.meta.main) {
  const values = benchArgs("link_probe_check.ts", {
    rates: { default: "100,400,1000", what: "Mbit/s" },
    rtts: { default: "0.2,2", what: "ms" },
    mib: { default: "3,8", what: "probe sizes, MiB" },
    repeats: { default: "5" },
  });
  const repeats = orExit(() => wholeNumber("--repeats", values.repeats, 1, 100));
  const check = await startRelayCheck();
  const { ceiling, cluster } = check;
  try {
    for (const rate of numberList("--rates", values.rates)) {
      for (const rttMs of numberList("--rtts", values.rtts)) {
        for (const mib of numberList("--mib", values.mib)) {
          const read: string[] = [];
          for (let rep = 0; rep < repeats; rep++) {
            const point = { rateBitsPerS: rate * 1e6, rttMs, lossFraction: 0 };
            const through = await throughRelay(check, point, 7 + rep);
            try {
              await through.monitor.measure(through.conn, Math.round(mib * 2 ** 20));
              const e = through.monitor.estimate(through.monitor.pairTo(through.conn));
              read.push(((e?.bandwidthBytesPerS ?? 0) / 1e6).toFixed(1));
            } finally {
              await through.close();
            }
          }
          const rateMBps = (rate / 8).toFixed(1);
          console.log(
            `${rate}M (${rateMBps} MB/s) ${rttMs}ms probe ${mib} MiB: ${read.join(" ")} MB/s`,
          );
        }
      }
    }
    console.log(`relay native, ceiling ${Math.round(ceiling.bitsPerS / 1e6)} Mbit/s`);
  } finally {
    await cluster.stop();
  }
}
