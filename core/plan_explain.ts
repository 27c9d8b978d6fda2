/**
 * A plan explained term by term: the handoff tail's parts, the benefit's parts, every
 * eligibility verdict and the decision. Used by `plan` on the command line and by the bench.
 * The terms add up exactly to the estimates `plan()` decided with.
 *
 * @module
 */
import type { Plan, PlanEstimates, PlanInput } from "./planner.ts";

/** One printed term: a label, its value in ms (or null for a note) and how it was obtained. */
export interface PlanTerm {
  group: "input" | "tail" | "benefit" | "verdict";
  label: string;
  ms: number | null;
  note: string;
}

/**
 * The terms of `p` for `input`.
 *
 * @example
 * ```ts
 * for (const t of explainPlan(input, plan(input))) console.log(t.label, t.ms, t.note);
 * ```
 */
export function explainPlan(input: PlanInput, p: Plan): PlanTerm[] {
  const out: PlanTerm[] = [];
  const add = (group: PlanTerm["group"], label: string, ms: number | null, note = "") =>
    out.push({ group, label, ms, note });
  const l = input.link;
  add(
    "input",
    "link",
    null,
    l
      ? `${_gbit(l.bandwidthBytesPerS)}, RTT ${l.rttMs} ms, loss ${_pct(l.lossFraction ?? 0)}` +
        `${
          l.lossSource === "datagrams"
            ? " (loss probe)"
            : l.lossSource === "pings"
            ? " (pings)"
            : l.lossSource === "stated"
            ? " (stated)"
            : ""
        }, ` +
        `measured ${_ms(l.ageMs)} ago`
      : "no measurement",
  );
  if (p.estimates?.lossLimited) {
    add(
      "input",
      "loss-limited rate",
      null,
      `${_gbit(p.estimates.linkBytesPerS)}: a sender losing ${_pct(l!.lossFraction ?? 0)} over ${
        l!.rttMs
      } ms averages no more (K / (RTT x sqrt(loss)))`,
    );
  }
  if (p.estimates && p.estimates.tailBytesPerS !== p.estimates.linkBytesPerS) {
    add(
      "input",
      "tail rate",
      null,
      `${_gbit(p.estimates.tailBytesPerS)}: what is queued at prefill end drains at the rate ` +
        "the pair's last large frames arrived at",
    );
  }
  if (input.congestionControl === "bbr" && (l?.lossFraction ?? 0) > 0) {
    add(
      "input",
      "congestion control",
      null,
      "BBR: paces at the link's measured rate and does not slow for random loss",
    );
  }
  add("input", "prompt", null, `${input.promptTokens} tokens, chunks of ${input.chunkTokens}`);
  const e = p.estimates;
  if (e) {
    add(
      "input",
      "state",
      null,
      `KV ${e.kvBytes} B (${input.state.kvBytesPerToken} B/token), final snapshot ` +
        `${e.snapshotBytes} B, total ${e.stateBytes} B`,
    );
    _tail(e, add);
    _benefit(input, e, add);
  }
  for (const r of p.reasons) add("verdict", r.code, null, r.message);
  return out;
}

type Add = (group: PlanTerm["group"], label: string, ms: number | null, note?: string) => void;

function _tail(e: PlanEstimates, add: Add): void {
  add(
    "tail",
    "uncovered KV transfer",
    e.uncoveredKvMs,
    "KV pages still on the wire at prefill end (the token history leaves first, at its start)",
  );
  add(
    "tail",
    "final snapshot transfer",
    e.snapshotTransferMs - (e.mtpMode === "transfer" ? e.mtpTransferMs : 0),
    "recurrent (conv + SSM) and SWA after the last page",
  );
  if (e.mtpMode === "transfer") add("tail", "MTP state transfer", e.mtpTransferMs, "sent");
  if (e.mtpMode === "reprime") {
    add("tail", "MTP reprime", null, "recomputed on the decoder (in import)");
  }
  if (e.manifestWaitMs) {
    add("tail", "prefiller work", e.manifestWaitMs, "tail export and probe beyond the transfer");
  }
  if (e.linkResidualMs) {
    add("tail", "link residual", e.linkResidualMs, "measured on this link beyond bytes / rate");
  }
  add("tail", "import", e.importMs, "last page + snapshot into the decoder's context");
  if (e.validateMs) {
    add("tail", "validate", e.validateMs, "manifest checked against the staged state, commit");
  }
  add("tail", "commit round trip", e.commitRoundTripMs, "CommitAck, one RTT");
  add("tail", "= handoff tail", e.handoffTailMs, "");
  if (e.probeMs) add("tail", "+ continuation probe", e.probeMs, "one decode step before CommitAck");
  if (e.probeWaitMs) {
    add("tail", "+ probe digest wait", e.probeWaitMs, "the prefiller's own probe ending later");
  }
}

function _benefit(i: PlanInput, e: PlanEstimates, add: Add): void {
  const bwPerMs = e.linkBytesPerS / 1000;
  const serialKvMs = e.kvBytes / bwPerMs;
  add(
    "benefit",
    "decoder prefill avoided",
    e.colocatedMs,
    `${i.promptTokens} tokens on the decoder`,
  );
  add("benefit", "- prefiller prefill", -e.prefillerPrefillMs, "");
  add(
    "benefit",
    "- prefiller contention",
    -(e.prefillerQueueMs ?? 0),
    "queue wait on the prefiller",
  );
  add("benefit", "- KV transfer (serial)", -serialKvMs, "all pages, as if sent after prefill");
  add(
    "benefit",
    "+ overlap benefit",
    serialKvMs - e.uncoveredKvMs,
    e.overlapFraction === null
      ? "one chunk: nothing to overlap"
      : `${_pct(e.overlapFraction)} of pages hidden`,
  );
  add(
    "benefit",
    "- rest of the tail",
    -(e.handoffTailMs - e.uncoveredKvMs),
    "snapshot, import, commit round trip",
  );
  add(
    "benefit",
    "= benefit",
    e.benefitMs,
    e.benefitMs > 0 ? "disaggregation is faster" : "recompute is faster",
  );
}

/** Lines for a terminal. */
export function formatPlanTerms(terms: readonly PlanTerm[]): string[] {
  return terms.map((t) => {
    const v = t.ms === null ? "" : _ms(t.ms);
    return `${t.group.padEnd(8)} ${t.label.padEnd(26)} ${v.padStart(10)}  ${t.note}`.trimEnd();
  });
}

function _ms(ms: number): string {
  return Math.abs(ms) >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}

function _gbit(bytesPerS: number): string {
  const bits = bytesPerS * 8;
  return bits >= 1e9 ? `${(bits / 1e9).toFixed(2)} Gbit/s` : `${(bits / 1e6).toFixed(0)} Mbit/s`;
}

function _pct(x: number): string {
  return `${(x * 100).toFixed(x < 0.01 && x > 0 ? 2 : 0)}%`;
}
