/**
 * The median of a list of numbers (the mean of the two middle ones for an even count; NaN for
 * none). The estimators in core/ (link estimates, handoff costs, the planner's link residual)
 * all summarize recent samples with it.
 *
 * @example
 * ```ts
 * median([3, 1, 2]); // 2
 * median([4, 1, 3, 2]); // 2.5
 * ```
 */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}
