/**
 * Where a request runs: disaggregated (a prefill worker prefills, the state moves to the
 * decode worker) or colocated (the decode worker prefills it itself).
 *
 * `auto` asks `core/planner.ts` with what the coordinator knows: the prompt's length, the
 * model's state sizes, the roles in the peers file, and whether the family is certified for an
 * exact handoff. This is the **no-link rule**: without a link measurement the planner's cost
 * comparison cannot run (live_placement.ts runs it once it has one, and falls back to this rule,
 * named, while a fact is missing), and the rule is: **disaggregate when
 * every eligibility check the planner makes, other than the missing link measurement, passes**
 * (notably `promptTokensMin`, 2048 tokens by default: shorter prompts recompute faster than a
 * handoff's fixed costs); otherwise run colocated, naming the planner's reasons. Numerical
 * identity and state schema are checked at connect time by `runHandoff`; a mismatch there runs
 * colocated with its reason. The decoder's free memory is not known to the coordinator and is
 * not checked here (the decoder's reservation checks it).
 *
 * `disaggregated` and `colocated` (`--placement`) override the planner. Either way the
 * placement and the reason travel in the response (`skippy` field, `x-skippy-placement`) and
 * in telemetry.
 */
import { plan, type PlanReason, type StateSize } from "../core/planner.ts";
import type { PlacementPrediction } from "../core/placement.ts";
import { FAMILIES } from "../models/mod.ts";

export type PlacementMode = "auto" | "disaggregated" | "colocated";
export const PLACEMENT_MODES: readonly PlacementMode[] = ["auto", "disaggregated", "colocated"];

export interface PlacementDecision {
  placement: "disaggregated" | "colocated";
  /** Why, in one line (the planner's reasons, or the override). */
  reason: string;
  /** The planner's prediction (live placement with every fact known), else absent or null. */
  prediction?: PlacementPrediction | null;
}

export interface PlacementInput {
  mode: PlacementMode;
  promptTokens: number;
  state: StateSize;
  family: string;
  hasPrefillWorker: boolean;
  /** Planner thresholds (e.g. `promptTokensMin`). */
  promptTokensMin?: number;
}

/** Unknown to the coordinator; the planner needs positive rates only to estimate costs. */
const UNKNOWN_RATE = 1;

export function decidePlacement(input: PlacementInput): PlacementDecision {
  if (!input.hasPrefillWorker) {
    return { placement: "colocated", reason: "no prefill worker in the peers file" };
  }
  if (input.mode === "colocated") {
    return { placement: "colocated", reason: "--placement colocated" };
  }
  if (input.mode === "disaggregated") {
    return { placement: "disaggregated", reason: "--placement disaggregated" };
  }
  const p = plan({
    promptTokens: input.promptTokens,
    state: input.state,
    link: null,
    prefillerPrefillTokensPerS: UNKNOWN_RATE,
    decoderPrefillTokensPerS: UNKNOWN_RATE,
    decoderFreeBytes: Number.MAX_SAFE_INTEGER,
    chunkTokens: 512,
    flags: {
      prefillerHasPrefillRole: true,
      decoderHasDecodeRole: true,
      schemaShared: true,
      identityMatch: true,
      familyCertified: (FAMILIES as readonly string[]).includes(input.family),
    },
  }, input.promptTokensMin === undefined ? {} : { promptTokensMin: input.promptTokensMin });
  const blocking = p.reasons.filter((r: PlanReason) =>
    r.code !== "chosen" && r.code !== "no-link-measurement" && r.code !== "decoder-memory"
  );
  if (blocking.length === 0) {
    return {
      placement: "disaggregated",
      reason: "planner: eligible; no link measurement, so disaggregated by rule",
    };
  }
  return {
    placement: "colocated",
    reason: `planner: ${blocking.map((r) => r.message).join("; ")}`,
  };
}
