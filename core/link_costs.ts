/**
 * The fixed costs of a handoff that the link rate does not explain, learned from the handoffs
 * a pair of nodes served (their telemetry), so the planner predicts with measurements, never
 * constants: the decoder's continuation probe (a first decode in a freshly imported context,
 * which costs several decode steps), how long its result waits for the prefiller's probe
 * digest (the prefiller's own first decode after prefill, which starts after its manifest
 * leaves and can end later than the decoder's import and probe), the import that could not
 * overlap the wire, the rest of the decoder's commit (validate and the commit itself), the
 * prefiller's own work between prefill end and the manifest (its tail export), how long before
 * compute end the last recurrent layer was captured (layer capture), what the link
 * part took beyond the model's transfer (the link residual), and what the client waits for
 * beyond the prefill (connection, reservation, the first token's trip).
 *
 * Pure: no clock, no I/O. Each term is the median of the newest `samplesMax` samples.
 *
 * @module
 */
import type { HandoffCosts, LinkResidualSample } from "./planner.ts";
import type { CaptureSchedule } from "./link_stream.ts";
import { UsageError } from "./errors.ts";
import { median } from "./median.ts";

/** The telemetry fields `HandoffCostRecorder.record` reads (core/telemetry.ts). */
export interface HandoffCostFacts {
  /** The prompt's tokens: the depth the decoder's probe decoded at. */
  promptTokens: number;
  totalBytes: number;
  bytesByComponent: Partial<Record<string, number>>;
  probeMs: number | null;
  lastImportMs: number;
  prefillMs: number | null;
  uncoveredTailMs: number | null;
  commitRoundTripMs: number | null;
  /** The prefiller's export work after prefill end (absent or null: an older prefiller). */
  tailExportMs?: number | null;
  /**
   * Prefiller: the last recurrent layer's capture to compute end (absent or null: no layer
   * capture, or an older prefiller).
   */
  captureLeadMs?: number | null;
  /** Prefiller: each captured piece's [ms before compute end, bytes] (absent or null: none). */
  captureSchedule?: readonly (readonly [number, number])[] | null;
  /** Prefiller: the last chunk's compute alone, ms (absent or null: not timed). */
  lastChunkMs?: number | null;
  /** Decoder: manifest received to commit (absent or null: not measured). */
  commitMs?: number | null;
  /** The RTT the predictions use for this link (absent or null: not measured). */
  rttMs?: number | null;
  /** The link rate the predictions use, bytes/s (absent or null: not measured). */
  bandwidthBytesPerS?: number | null;
  /**
   * Decoder: how long its probe result waited for the prefiller's probe digest (absent or
   * null: not measured).
   */
  probeWaitMs?: number | null;
}

/**
 * One continuation probe: the depth it decoded at (the prompt's tokens) and how long it took.
 * A decode step's cost grows with depth (super-mini 8 ms at 512 tokens, 37 at 32K).
 */
export type ProbeSample = readonly [promptTokens: number, ms: number];

/** What the recorder has learned; a term with no sample is absent. */
export interface MeasuredHandoffCosts extends HandoffCosts {
  /** Decoder: the continuation probes before CommitAck, oldest first (`probeMsAt` reads them). */
  probes?: readonly ProbeSample[];
  /** Client: TTFT less the prefiller's prefill (setup and the first token's trip). */
  firstTokenOverheadMs?: number;
  /** Handoffs learned from. */
  samples: number;
}

/**
 * Learns one peer pair's handoff costs.
 *
 * @example
 * ```ts
 * const costs = new HandoffCostRecorder();
 * costs.record(record.telemetry, record.ttftMs);
 * planInput.costs = costs.costs(); // { probes: [[512, 41]], importMsPerMiB: 0, ... }
 * ```
 */
export class HandoffCostRecorder {
  readonly samplesMax: number;
  readonly #probe: ProbeSample[] = [];
  readonly #probeWait: number[] = [];
  readonly #validate: number[] = [];
  readonly #importPerMiB: number[] = [];
  readonly #firstToken: number[] = [];
  readonly #prefillerPost: number[] = [];
  readonly #captureLead: number[] = [];
  /** The newest capture schedule, as shares of its last chunk and of its bytes. */
  #schedule: CaptureSchedule | null = null;
  /**
   * (RTT, what the link part took beyond the model's transfer and one RTT, the link rate, the
   * prompt's tokens): ms, ms, bytes/s (null: not measured), tokens.
   */
  readonly #residual: LinkResidualSample[] = [];
  #samples = 0;

  constructor(samplesMax = 8) {
    if (!(Number.isInteger(samplesMax) && samplesMax > 0)) {
      throw new UsageError(`Invalid samplesMax ${samplesMax}: must be a positive integer`);
    }
    this.samplesMax = samplesMax;
  }

  /**
   * One served handoff, the client's TTFT for it when the caller measured one, and the link
   * time after prefill end the model predicted for it. The prefiller's own work after prefill
   * end is its measured tail export (`tailExportMs`). From an older prefiller that does not
   * report it, prefill end to the manifest leaving is learned only where nothing can have held
   * the manifest back (`predictedLinkMs` 0: an unshaped link): inferring it wherever the link
   * was predicted to be short learned link stalls the model missed (flow control, loss
   * recovery) as prefiller work, and over-predicted every later tail.
   */
  record(
    t: HandoffCostFacts,
    clientTtftMs: number | null = null,
    predictedLinkMs: number | null = null,
  ): void {
    this.#samples++;
    if (t.tailExportMs !== undefined && t.tailExportMs !== null && t.tailExportMs >= 0) {
      this.#push(this.#prefillerPost, t.tailExportMs);
    } else if (
      t.uncoveredTailMs !== null && t.commitRoundTripMs !== null && predictedLinkMs === 0
    ) {
      const post = t.uncoveredTailMs - t.commitRoundTripMs;
      if (post >= 0) this.#push(this.#prefillerPost, post);
    }
    const lead = t.captureLeadMs ?? null;
    if (lead !== null && lead >= 0) this.#push(this.#captureLead, lead);
    this.#schedule = _scheduleShares(t) ?? this.#schedule;
    const rtt = t.rttMs ?? null, commit = t.commitMs ?? null;
    if (predictedLinkMs !== null && rtt !== null && commit !== null && t.uncoveredTailMs !== null) {
      // The tail less the decoder's part (import, probe) is the link's part.
      const own = Math.max(predictedLinkMs, t.tailExportMs ?? 0);
      const rate = t.bandwidthBytesPerS ?? null;
      this.#residual.push([rtt, t.uncoveredTailMs - commit - own - rtt, rate, t.promptTokens]);
      if (this.#residual.length > this.samplesMax) this.#residual.shift();
    }
    if (t.probeMs !== null && t.probeMs >= 0) this.#push(this.#probe, [t.promptTokens, t.probeMs]);
    const wait = t.probeWaitMs ?? null;
    if (wait !== null && wait >= 0) this.#push(this.#probeWait, wait);
    // The decoder's commit less what is predicted apart: its validate and the commit itself.
    if (commit !== null && t.probeMs !== null && t.lastImportMs >= 0) {
      const validate = commit - t.lastImportMs - t.probeMs - (wait ?? 0);
      if (validate >= 0) this.#push(this.#validate, validate);
    }
    // What is left to import at commit: everything but the pages staged on arrival.
    const tailBytes = t.totalBytes - (t.bytesByComponent["kv-page"] ?? 0);
    if (tailBytes > 0 && t.lastImportMs >= 0) {
      this.#push(this.#importPerMiB, t.lastImportMs / (tailBytes / 2 ** 20));
    }
    if (clientTtftMs !== null && t.prefillMs !== null && clientTtftMs >= t.prefillMs) {
      this.#push(this.#firstToken, clientTtftMs - t.prefillMs);
    }
  }

  costs(): MeasuredHandoffCosts {
    const out: MeasuredHandoffCosts = { samples: this.#samples };
    if (this.#probe.length) out.probes = [...this.#probe];
    if (this.#probeWait.length) out.probeWaitMs = median(this.#probeWait);
    if (this.#validate.length) out.validateMs = median(this.#validate);
    if (this.#importPerMiB.length) out.importMsPerMiB = median(this.#importPerMiB);
    if (this.#firstToken.length) out.firstTokenOverheadMs = median(this.#firstToken);
    if (this.#prefillerPost.length) out.prefillerPostMs = median(this.#prefillerPost);
    if (this.#captureLead.length) out.captureLeadMs = median(this.#captureLead);
    if (this.#schedule) out.captureSchedule = this.#schedule;
    if (this.#residual.length) {
      out.linkResidual = { samples: this.#residual.map(([r, ms, bw, d]) => [r, ms, bw, d]) };
    }
    return out;
  }

  #push<T>(xs: T[], v: T): void {
    xs.push(v);
    if (xs.length > this.samplesMax) xs.shift();
  }
}

/**
 * A handoff's capture schedule as [share of its last chunk before compute end, share of the
 * captured bytes] (null: none captured, or the chunk was not timed).
 */
function _scheduleShares(t: HandoffCostFacts): CaptureSchedule | null {
  const s = t.captureSchedule ?? null, chunkMs = t.lastChunkMs ?? null;
  if (s === null || s.length === 0 || chunkMs === null || !(chunkMs > 0)) return null;
  const bytes = s.reduce((a, [, b]) => a + b, 0);
  if (!(bytes > 0)) return null;
  return s.map(([ms, b]) => [Math.min(1, Math.max(0, ms / chunkMs)), b / bytes] as const);
}

/**
 * HandoffCosts.linkResidual on a link of `rttMs` and `bytesPerS` for a prompt of
 * `promptTokens`: the median of the samples measured on a similar link, never below 0; 0
 * without samples. Similar: an RTT within a factor of 2, and a rate within a factor of 2 where
 * both are known (a slow or lossy link's stalls say nothing about a fast one at the same RTT).
 * With no similar sample, the samples at a similar RTT whatever their rate; with none of those,
 * all samples. Of the similar samples, those from prompts within a factor of 2 of this one
 * where there are any (with layer capture the residual is how the captured layers met the link
 * over the last chunk, whose length grows with depth); else all of them.
 *
 * @example
 * ```ts
 * linkResidualAt([[0.3, 40, 1e8], [0.2, 60, 1.2e8], [0.2, 900, 1e7], [11, 900, 1e8]], 0.25, 1e8); // 50
 * linkResidualAt([[2, 80, 1e7, 512], [2, 30, 1e7, 2048]], 2, 1e7, 2000); // 30
 * ```
 */
export function linkResidualAt(
  samples: readonly LinkResidualSample[],
  rttMs: number,
  bytesPerS: number | null = null,
  promptTokens: number | null = null,
): number {
  if (samples.length === 0) return 0;
  const atRtt = samples.filter(([r]) => _withinFactor2(r, rttMs));
  const alike = atRtt.filter(([, , bw]) =>
    bw == null || bytesPerS === null || _withinFactor2(bw, bytesPerS)
  );
  const pick = alike.length ? alike : atRtt.length ? atRtt : samples;
  const deep = pick.filter(([, , , d]) =>
    d == null || promptTokens === null || _withinFactor2(d, promptTokens)
  );
  return Math.max(0, median((deep.length ? deep : pick).map(([, y]) => y)));
}

/**
 * The decoder's probe at a prompt of `promptTokens`, from the pair's own probes: those taken
 * at a similar depth (within a factor of 2; with none, all of them), each carried to this depth
 * by what the decoder's decode step costs there over its step at the probe's own depth
 * (`stepMsAt`, from the node's rates), and their median. A pair that served only short prompts
 * so predicts a deep one's probe from its own measurement and the node's depth curve, not as a
 * short one. Carried by the difference, not the ratio: a probe is a step plus the first
 * decode's own overhead. On super-mini (the matrix runs of 2026-12-05, every probe at a depth
 * pooled) the difference carried 512 tokens' probes to 2K, 2K's to 8K, 8K's to 32K and 512's to
 * 32K to +3%, -4%, -10% and -11% of the probes measured there, the ratio to +15%, +15%, +7% and
 * +41%; one median over the depths served would have said -12%, -39%, -58% and -77%.
 *
 * @example
 * ```ts
 * probeMsAt([[512, 8], [512, 9], [2048, 10]], 512, (d) => 5 + d / 1000); // 8.5 (the 512s)
 * probeMsAt([[512, 8]], 32768, (d) => 5 + d / 1000); // 8 + 32.256 = 40.256
 * ```
 */
export function probeMsAt(
  samples: readonly ProbeSample[],
  promptTokens: number,
  stepMsAt: (promptTokens: number) => number,
): number | null {
  if (samples.length === 0) return null;
  const alike = samples.filter(([d]) => _withinFactor2(d, promptTokens));
  const here = stepMsAt(promptTokens);
  return Math.max(
    0,
    median((alike.length ? alike : samples).map(([d, ms]) => ms + (here - stepMsAt(d)))),
  );
}

/** Whether two measures are alike: the larger at most twice the smaller (an RTT, rate, depth). */
function _withinFactor2(a: number, b: number): boolean {
  return Math.max(a, b) <= 2 * Math.min(a, b);
}
