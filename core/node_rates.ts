/**
 * Per-node compute rates: prefill and decode tokens/s at the context depths a node has served,
 * from its own measurements or a calibration file (`bench calibrate`). The planner uses these,
 * never constants; a rate with no source is refused.
 *
 * Rates are kept as points (context depth, tokens/s). Between points the time per token is
 * interpolated linearly (it grows with depth as attention reads more KV); below the first it is
 * held, beyond the last it keeps growing along the last two points' slope to twice that depth
 * (`msPerTokenAt`).
 * Prefilling tokens a..b costs the integral of time per token.
 *
 * @module
 */
import { UsageError } from "./errors.ts";

/** One measured rate at a context depth. */
export interface RatePoint {
  /** Context depth (tokens already in the cache) the rate was measured at. */
  contextTokens: number;
  tokensPerS: number;
}

/** Where a node's rates came from, printed with every plan. */
export type RateSource = "measured" | "calibration" | "placeholder";

/** What a node reports about its speed. */
export interface NodeRates {
  nodeId: string;
  source: RateSource;
  /** Free text: the file, the machine, the run. */
  sourceNote?: string;
  prefill: RatePoint[];
  decode: RatePoint[];
}

/** The calibration file's version. Changelog: 1. First version. */
export const CALIBRATION_FILE_VERSION = 1;

/** Bounds on what is kept, each with its unit last. */
export const RATE_POINTS_MAX = 64;

/**
 * Milliseconds to prefill tokens `fromTokens`..`toTokens` at `points`.
 *
 * @example
 * ```ts
 * prefillMsFor([{ contextTokens: 0, tokensPerS: 1000 }], 0, 2000); // 2000
 * ```
 */
export function prefillMsFor(
  points: readonly RatePoint[],
  fromTokens: number,
  toTokens: number,
): number {
  _checkPoints(points, "prefill");
  if (!(toTokens >= fromTokens && fromTokens >= 0)) {
    throw new UsageError(`Invalid token range ${fromTokens}..${toTokens}`);
  }
  const ps = [...points].sort((a, b) => a.contextTokens - b.contextTokens);
  // Breakpoints of the piecewise-linear seconds-per-token function, within the range.
  const xs = [
    fromTokens,
    ...ps.map((p) => p.contextTokens).filter((x) => x > fromTokens && x < toTokens),
    toTokens,
  ];
  let ms = 0;
  for (let k = 1; k < xs.length; k++) {
    const a = xs[k - 1], b = xs[k];
    ms += ((b - a) * (msPerTokenAt(ps, a) + msPerTokenAt(ps, b))) / 2;
  }
  return ms;
}

/**
 * Milliseconds per token at depth `contextTokens`: interpolated between points, held below the
 * first, and beyond the last continued along the last two points' slope where it grows, out to
 * twice the last point's depth (held beyond that, where the slope falls, or with one point). A point recorded from a whole prefill sits at its
 * prompt's middle depth, so holding it to the prompt's end under-counted every deeper token:
 * lab-state's 2K prefills were predicted 5% short with the 512 and 2K points alone.
 */
export function msPerTokenAt(points: readonly RatePoint[], contextTokens: number): number {
  const ps = [...points].sort((a, b) => a.contextTokens - b.contextTokens);
  if (ps.length === 0) throw new UsageError("No rate points");
  const t = (p: RatePoint) => 1000 / p.tokensPerS;
  if (contextTokens <= ps[0].contextTokens) return t(ps[0]);
  const last = ps[ps.length - 1];
  if (contextTokens >= last.contextTokens) {
    if (ps.length < 2) return t(last);
    const prev = ps[ps.length - 2];
    const slope = (t(last) - t(prev)) / (last.contextTokens - prev.contextTokens);
    // Out to twice the last point's depth: the end of the prompt that point is the middle of.
    const beyond = Math.min(contextTokens, 2 * last.contextTokens) - last.contextTokens;
    return t(last) + Math.max(0, slope) * beyond;
  }
  let k = 1;
  while (ps[k].contextTokens < contextTokens) k++;
  const a = ps[k - 1], b = ps[k];
  const f = (contextTokens - a.contextTokens) / (b.contextTokens - a.contextTokens);
  return t(a) + f * (t(b) - t(a));
}

/** Average prefill tokens/s over a prompt of `tokens` (what `plan()` takes). */
export function averagePrefillTokensPerS(
  points: readonly RatePoint[],
  tokens: number,
  fromTokens = 0,
): number {
  return ((tokens - fromTokens) / prefillMsFor(points, fromTokens, tokens)) * 1000;
}

/** A handoff record's prefill figures (core/telemetry.ts), what `recordHandoffPrefill` reads. */
export interface PrefillTiming {
  promptTokens: number;
  cachedTokens?: number;
  prefillMs: number | null;
  lastChunkTokens?: number | null;
  lastChunkMs?: number | null;
}

/** One measurement kept by a RateRecorder: its depth and rate. */
interface _Sample {
  depth: number;
  rate: number;
}

/**
 * Accumulates a node's own measurements into rate points, bucketed by depth (powers of two),
 * keeping the newest `samplesPerBucketMax` per bucket. A point sits at its samples' mean
 * depth, not the bucket's: a prompt's last chunk (3,561-4,073) and a whole 4K prompt's middle
 * (2,036) share no bucket edge, and where the time per token grows with depth a point placed at
 * 4,096 for samples taken at 3,817 would read that depth's rate as 7% deeper.
 *
 * @example
 * ```ts
 * const r = new RateRecorder("node-a");
 * r.recordPrefill(4096, 2100); // 4096 tokens from depth 0 in 2.1 s
 * r.rates().prefill; // [{ contextTokens: 2048, tokensPerS: ~1950 }]
 * ```
 */
export class RateRecorder {
  readonly nodeId: string;
  readonly samplesPerBucketMax: number;
  readonly #prefill = new Map<number, _Sample[]>();
  readonly #decode = new Map<number, _Sample[]>();

  constructor(nodeId: string, samplesPerBucketMax = 8) {
    this.nodeId = nodeId;
    this.samplesPerBucketMax = samplesPerBucketMax;
  }

  /** A prefill of `tokens` tokens starting at depth `fromTokens` that took `ms`. */
  recordPrefill(tokens: number, ms: number, fromTokens = 0): void {
    if (!(tokens > 0 && ms > 0)) return;
    this.#add(this.#prefill, fromTokens + tokens / 2, (tokens / ms) * 1000);
  }

  /**
   * A handoff's prefill: the tokens it computed over its prefill time, and its last chunk,
   * timed alone, at that chunk's own depth (the deepest tokens, the slowest, whose length the
   * tail of the next handoff of that length depends on).
   */
  recordHandoffPrefill(t: PrefillTiming): void {
    const cached = t.cachedTokens ?? 0;
    const computed = t.promptTokens - cached;
    if (t.prefillMs) this.recordPrefill(computed, t.prefillMs, cached);
    const tokens = t.lastChunkTokens ?? 0, ms = t.lastChunkMs ?? 0;
    if (tokens > 0 && tokens < computed && ms > 0) {
      this.recordPrefill(tokens, ms, t.promptTokens - tokens);
    }
  }

  /** `tokens` decode steps at depth about `contextTokens` that took `ms` together. */
  recordDecode(tokens: number, ms: number, contextTokens: number): void {
    if (!(tokens > 0 && ms > 0)) return;
    this.#add(this.#decode, contextTokens, (tokens / ms) * 1000);
  }

  rates(): NodeRates {
    const points = (m: Map<number, _Sample[]>) =>
      [...m.entries()].sort((a, b) => a[0] - b[0]).map(([_bucket, xs]) => ({
        contextTokens: xs.reduce((sum, x) => sum + x.depth, 0) / xs.length,
        tokensPerS: xs.map((x) => x.rate).sort((a, b) => a - b)[xs.length >> 1],
      }));
    return {
      nodeId: this.nodeId,
      source: "measured",
      prefill: points(this.#prefill),
      decode: points(this.#decode),
    };
  }

  #add(m: Map<number, _Sample[]>, depth: number, rate: number): void {
    const bucket = depth < 1 ? 0 : 2 ** Math.round(Math.log2(depth));
    if (!m.has(bucket) && m.size >= RATE_POINTS_MAX) return;
    const xs = m.get(bucket) ?? [];
    xs.push({ depth, rate });
    if (xs.length > this.samplesPerBucketMax) xs.shift();
    m.set(bucket, xs);
  }
}

/**
 * Reads a calibration file's parsed JSON: `{ version: 1, nodes: [{ nodeId, prefill: [...],
 * decode: [...], sourceNote? }] }`. Throws UsageError naming the first bad field.
 */
export function parseCalibration(json: unknown, fileName = "calibration file"): NodeRates[] {
  const bad = (what: string) =>
    new UsageError(`Invalid ${fileName}: ${what}. Write it with \`bench calibrate\``);
  if (typeof json !== "object" || json === null) throw bad("not a JSON object");
  const j = json as Record<string, unknown>;
  if (j.version !== CALIBRATION_FILE_VERSION) {
    throw bad(`version ${String(j.version)} is not ${CALIBRATION_FILE_VERSION}`);
  }
  if (!Array.isArray(j.nodes) || j.nodes.length === 0) throw bad('"nodes" is not a non-empty list');
  return j.nodes.map((n, k) => {
    if (typeof n !== "object" || n === null || typeof n.nodeId !== "string" || !n.nodeId) {
      throw bad(`nodes[${k}] has no "nodeId"`);
    }
    const rates: NodeRates = {
      nodeId: n.nodeId,
      source: "calibration",
      sourceNote: typeof n.sourceNote === "string" ? n.sourceNote.slice(0, 256) : fileName,
      prefill: n.prefill,
      decode: n.decode,
    };
    try {
      _checkPoints(rates.prefill, "prefill");
      _checkPoints(rates.decode, "decode");
    } catch (e) {
      throw bad(`nodes[${k}]: ${(e as Error).message}`);
    }
    return rates;
  });
}

function _checkPoints(points: unknown, what: string): asserts points is RatePoint[] {
  if (!Array.isArray(points) || points.length === 0 || points.length > RATE_POINTS_MAX) {
    throw new UsageError(`${what} rates must be a list of 1 to ${RATE_POINTS_MAX} points`);
  }
  for (const p of points) {
    if (
      typeof p !== "object" || p === null ||
      !(Number.isFinite(p.contextTokens) && p.contextTokens >= 0) ||
      !(Number.isFinite(p.tokensPerS) && p.tokensPerS > 0)
    ) {
      throw new UsageError(
        `${what} rate point ${JSON.stringify(p)} needs contextTokens >= 0 and tokensPerS > 0`,
      );
    }
  }
}
