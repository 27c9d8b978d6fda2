/**
 * The `link` bench section's table, notes and charts (the runs are in link_bench.ts).
 */
import type { ReportSection } from "./report.ts";
import { table } from "./stats.ts";
import { lineChart } from "./svg.ts";
import { type LinkBenchRow, runLinkBench } from "./link_bench.ts";

const _pct = (pred: number | null, meas: number | null) =>
  pred === null || meas === null || meas === 0
    ? ""
    : `${(((pred - meas) / meas) * 100).toFixed(0)}%`;

/**
 * The tail less the decoder's probe step: what the link model predicts (transfer, import,
 * commit round trip), apart from a compute step whose time this shared machine makes noisy.
 */
function _linkPart(x: LinkBenchRow, which: "predicted" | "measured"): number | null {
  const tail = which === "predicted" ? x.predictedTailMs : x.measuredTailMs;
  const probe = which === "predicted" ? x.predictedProbeMs : x.measuredProbeMs;
  return tail === null || probe === null ? null : tail - probe;
}

/** The bench section: table, notes and charts. */
export async function linkSection(o: { modelDir: string; quick: boolean }): Promise<ReportSection> {
  const r = await runLinkBench(o);
  const f = (v: number | null, d = 0) => (v === null ? "-" : v.toFixed(d));
  const ran = r.rows.filter((x) => x.refused === null);
  const label = (x: LinkBenchRow) =>
    `${x.rateBitsPerS / 1e6}M/${x.rttMs}ms/${x.lossFraction * 100}%`;
  return {
    name: "link",
    rows: r,
    table: table(
      [
        "link",
        "prompt",
        "rtt ms",
        "MB/s",
        "from",
        "handoff MB/s",
        "prefill",
        "pred TTFT",
        "meas TTFT",
        "err",
        "pred tail",
        "meas tail",
        "err",
        "probe p/m",
        "link part p/m",
        "err",
        "drops",
        "planner / refused",
      ],
      r.rows.map((x) => [
        label(x),
        x.promptTokens,
        f(x.measuredRttMs, 2),
        x.measuredBytesPerS === null ? "-" : (x.measuredBytesPerS / 1e6).toFixed(2),
        x.bandwidthSource ?? "-",
        x.handoffSampleBytesPerS === null ? "-" : (x.handoffSampleBytesPerS / 1e6).toFixed(2),
        f(x.measuredPrefillMs),
        f(x.predictedTtftMs),
        f(x.measuredTtftMs),
        _pct(x.predictedTtftMs, x.measuredTtftMs),
        f(x.predictedTailMs),
        f(x.measuredTailMs),
        _pct(x.predictedTailMs, x.measuredTailMs),
        `${f(x.predictedProbeMs)}/${f(x.measuredProbeMs)}`,
        `${f(_linkPart(x, "predicted"))}/${f(_linkPart(x, "measured"))}`,
        _pct(_linkPart(x, "predicted"), _linkPart(x, "measured")),
        x.relayDrops ?? "-",
        x.refused ?? x.decision ?? "",
      ]),
    ),
    notes: [
      `${r.model}; ${r.relay} relay, ceiling measured at ${
        (r.ceiling.bitsPerS / 1e6).toFixed(1)
      } Mbit/s ` +
      `(${r.ceiling.packets} packets of ${r.ceiling.packetBytes} B); rates over 0.8 of it are refused.`,
      r.degrade
        ? `Degradation mid-run (RTT ${r.degrade.fromRttMs} -> ${r.degrade.toRttMs} ms, pings every ${r.degrade.pingIntervalMs} ms): flagged after ${
          r.degrade.detectMs === null
            ? "never (not within 5 s)"
            : `${r.degrade.detectMs.toFixed(0)} ms`
        } (stated bound ${r.degrade.boundMs} ms), from then on new requests get "link-degraded" and run colocated; the request in flight ${
          r.degrade.inFlightError
            ? `FAILED: ${r.degrade.inFlightError}`
            : `completed (${r.degrade.inFlightPlacement})`
        }.`
        : "Degradation scenario not run (10 Mbit/s over the relay ceiling).",
      (() => {
        const errs = ran.map((x) => {
          const p = _linkPart(x, "predicted"), m = _linkPart(x, "measured");
          return p === null || m === null || m === 0 ? NaN : Math.abs((p - m) / m);
        }).filter(Number.isFinite).sort((a, b) => a - b);
        return `Link part of the tail (tail less the probe step): ${
          errs.filter((e) => e <= 0.15).length
        } of ${errs.length} runs within 15%, median |error| ${
          errs.length ? (errs[errs.length >> 1] * 100).toFixed(0) : "-"
        }%. Prefill and the probe step are compute, and on this shared 2-core machine their times vary several-fold between identical runs, so TTFT and the whole tail inherit that noise.`;
      })(),
      r.cc.length
        ? `One raw QUIC stream (about a second of data) at ${
          r.cc[0].rateBitsPerS / 1e6
        } Mbit/s, RTT ${r.cc[0].rttMs} ms, share of line rate by loss: ${
          r.cc.map((c) =>
            `${c.congestionControl === "default" ? "Cubic" : "BBR"} ${c.lossFraction * 100}% ${
              c.ofLineRate.toFixed(2)
            }`
          ).join(", ")
        } (median of the repeats; see bench/cc_bench.ts for the rates 100M-1G).`
        : "Congestion-control comparison not run (relay ceiling too low).",
      `${ran.length} of ${r.rows.length} points measured. Link figures are measured through the relay (pings + one probe), rates calibrated on the unshaped path; TTFT on the client's clock, tail = prefill end to CommitAck.`,
    ],
    charts: {
      "link-part.svg": lineChart([
        {
          name: "predicted link part of the tail",
          points: ran.map((x, k) => ({ x: k + 1, y: _linkPart(x, "predicted") ?? 0 })),
        },
        {
          name: "measured link part of the tail",
          points: ran.map((x, k) => ({ x: k + 1, y: _linkPart(x, "measured") ?? 0 })),
        },
      ], {
        title: "Tail less the decoder's probe step: transfer, import, commit round trip",
        xLabel: "measured point # (table order)",
        yLabel: "ms",
      }),
      "link-tail.svg": lineChart([
        {
          name: "predicted tail",
          points: ran.map((x, k) => ({ x: k + 1, y: x.predictedTailMs ?? 0 })),
        },
        {
          name: "measured tail",
          points: ran.map((x, k) => ({ x: k + 1, y: x.measuredTailMs ?? 0 })),
        },
        {
          name: "predicted TTFT",
          points: ran.map((x, k) => ({ x: k + 1, y: x.predictedTtftMs ?? 0 })),
        },
        {
          name: "measured TTFT",
          points: ran.map((x, k) => ({ x: k + 1, y: x.measuredTtftMs ?? 0 })),
        },
      ], {
        title: `Predicted vs measured per emulated point (${ran.map(label).join(", ")})`,
        xLabel: "measured point #",
        yLabel: "ms",
      }),
    },
  };
}
