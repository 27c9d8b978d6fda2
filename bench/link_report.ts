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

type _LinkBenchResult = Awaited<ReturnType<typeof runLinkBench>>;

const _label = (x: LinkBenchRow) =>
  `${x.rateBitsPerS / 1e6}M/${x.rttMs}ms/${x.lossFraction * 100}%`;

/** The bench section: table, notes and charts. */
export async function linkSection(o: { modelDir: string; quick: boolean }): Promise<ReportSection> {
  const r = await runLinkBench(o);
  const ran = r.rows.filter((x) => x.refused === null);
  return {
    name: "link",
    rows: r,
    table: _linkTable(r.rows),
    notes: _linkNotes(r, ran),
    charts: _linkCharts(ran),
  };
}

/** One line per grid point and prompt: measured link, predicted against measured, the planner. */
function _linkTable(rows: LinkBenchRow[]): string {
  const f = (v: number | null, d = 0) => (v === null ? "-" : v.toFixed(d));
  return table(
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
    rows.map((x) => [
      _label(x),
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
  );
}

/** The notes under the table: relay, degradation, link-part accuracy, congestion control. */
function _linkNotes(r: _LinkBenchResult, ran: LinkBenchRow[]): string[] {
  return [
    `${r.model}; ${r.relay} relay, ceiling measured at ${
      (r.ceiling.bitsPerS / 1e6).toFixed(1)
    } Mbit/s ` +
    `(${r.ceiling.packets} packets of ${r.ceiling.packetBytes} B); rates over 0.8 of it are refused.`,
    _degradeNote(r.degrade),
    _linkPartNote(ran),
    _ccNote(r.cc),
    `${ran.length} of ${r.rows.length} points measured. Link figures are measured through the relay (pings + one probe), rates calibrated on the unshaped path; TTFT on the client's clock, tail = prefill end to CommitAck.`,
  ];
}

function _degradeNote(d: _LinkBenchResult["degrade"]): string {
  return d
    ? `Degradation mid-run (RTT ${d.fromRttMs} -> ${d.toRttMs} ms, pings every ${d.pingIntervalMs} ms): flagged after ${
      d.detectMs === null ? "never (not within 5 s)" : `${d.detectMs.toFixed(0)} ms`
    } (stated bound ${d.boundMs} ms), from then on new requests get "link-degraded" and run colocated; the request in flight ${
      d.inFlightError ? `FAILED: ${d.inFlightError}` : `completed (${d.inFlightPlacement})`
    }.`
    : "Degradation scenario not run (10 Mbit/s over the relay ceiling).";
}

function _linkPartNote(ran: LinkBenchRow[]): string {
  const errs = ran.map((x) => {
    const p = _linkPart(x, "predicted"), m = _linkPart(x, "measured");
    return p === null || m === null || m === 0 ? NaN : Math.abs((p - m) / m);
  }).filter(Number.isFinite).sort((a, b) => a - b);
  return `Link part of the tail (tail less the probe step): ${
    errs.filter((e) => e <= 0.15).length
  } of ${errs.length} runs within 15%, median |error| ${
    errs.length ? (errs[errs.length >> 1] * 100).toFixed(0) : "-"
  }%. Prefill and the probe step are compute, and on this shared 2-core machine their times vary several-fold between identical runs, so TTFT and the whole tail inherit that noise.`;
}

function _ccNote(cc: _LinkBenchResult["cc"]): string {
  return cc.length
    ? `One raw QUIC stream (about a second of data) at ${cc[0].rateBitsPerS / 1e6} Mbit/s, RTT ${
      cc[0].rttMs
    } ms, share of line rate by loss: ${
      cc.map((c) =>
        `${c.congestionControl === "default" ? "Cubic" : "BBR"} ${c.lossFraction * 100}% ${
          c.ofLineRate.toFixed(2)
        }`
      ).join(", ")
    } (median of the repeats; see bench/cc_bench.ts for the rates 100M-1G).`
    : "Congestion-control comparison not run (relay ceiling too low).";
}

/** Predicted against measured per measured point: the link part, then tail and TTFT. */
function _linkCharts(ran: LinkBenchRow[]): Record<string, string> {
  const series = (name: string, y: (x: LinkBenchRow) => number | null) => ({
    name,
    points: ran.map((x, k) => ({ x: k + 1, y: y(x) ?? 0 })),
  });
  return {
    "link-part.svg": lineChart([
      series("predicted link part of the tail", (x) => _linkPart(x, "predicted")),
      series("measured link part of the tail", (x) => _linkPart(x, "measured")),
    ], {
      title: "Tail less the decoder's probe step: transfer, import, commit round trip",
      xLabel: "measured point # (table order)",
      yLabel: "ms",
    }),
    "link-tail.svg": lineChart([
      series("predicted tail", (x) => x.predictedTailMs),
      series("measured tail", (x) => x.measuredTailMs),
      series("predicted TTFT", (x) => x.predictedTtftMs),
      series("measured TTFT", (x) => x.measuredTtftMs),
    ], {
      title: `Predicted vs measured per emulated point (${ran.map(_label).join(", ")})`,
      xLabel: "measured point #",
      yLabel: "ms",
    }),
  };
}
