/**
 * The token ranges a staged import's pages cover, per target (the context, or the MTP draft):
 * whether a new page may be staged (an attention KV page inside the handoff's tokens that
 * overlaps nothing already staged, within the page bound), and at `validate` whether the ranges
 * tile the handoff's tokens exactly. A duplicated or replayed page is refused when it arrives,
 * a missing one before commit.
 */
import { LimitExceededError, StateValidationError } from "../core/errors.ts";
import { firstTilingFault, formatRange, type Range } from "../core/schema.ts";
import type { Target } from "./_staged_final.ts";

/** Refuses a page (`what`, of token `range` and `cache`) that `t` cannot stage. */
export function checkPageRange(
  t: Target,
  cache: number,
  range: Range,
  what: string,
  bounds: { nTokens: number; pagesMax: number },
): void {
  if (cache !== 0) {
    throw new StateValidationError(`Cannot stage ${what}: it is not an attention KV page`);
  }
  if (range[1] > bounds.nTokens) {
    throw new StateValidationError(
      `Cannot stage ${what}: it lies outside the handoff's tokens [0, ${bounds.nTokens})`,
    );
  }
  const at = insertionIndex(t.ranges, range[0]);
  const clash = [t.ranges[at - 1], t.ranges[at]].find((r) =>
    r !== undefined && r[0] < range[1] && range[0] < r[1]
  );
  if (clash) {
    throw new StateValidationError(
      `Cannot stage ${what}: it overlaps ${t.component} tokens ${
        formatRange(clash)
      } already staged`,
      { hint: "a page was duplicated or replayed" },
    );
  }
  if (t.ranges.length >= bounds.pagesMax) {
    throw new LimitExceededError(
      `Cannot stage ${what}: more than ${bounds.pagesMax} pages`,
    );
  }
}

/** Records a staged page's range, keeping `t.ranges` sorted by start. */
export function addPageRange(t: Target, range: Range): void {
  t.ranges.splice(insertionIndex(t.ranges, range[0]), 0, range);
}

/**
 * Refuses a commit while the pages of a target leave a token of [0, `nTokens`) uncovered or
 * cover one twice. A recurrent-only context has no pages and is skipped.
 */
export function checkTiling(targets: readonly Target[], nTokens: number): void {
  for (const t of targets) {
    if (t.backend.kind === "recurrent") continue;
    const fault = firstTilingFault(t.ranges, nTokens);
    if (fault) {
      const what = `${t.component} tokens ${formatRange(fault.range)}`;
      throw new StateValidationError(
        `Cannot commit: ${what} ${fault.fault === "gap" ? "missing" : "staged twice"}`,
        {
          hint: "every page of [0, n) must arrive before commit",
        },
      );
    }
  }
}

/** Where a range starting at `start` goes in `ranges` (sorted by start, non-overlapping). */
function insertionIndex(ranges: readonly Range[], start: number): number {
  let lo = 0;
  let hi = ranges.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[mid][0] < start) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
