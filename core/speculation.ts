/**
 * Speculative decoding, the pure part: the modes, the greedy acceptance rule and the
 * per-source acceptance counters. The loop that drives llama.cpp lives in
 * `serve/speculative.ts`; nothing here knows a model.
 *
 * A proposal is an MTP prefix followed by a suffix-proposer tail. The target verifies all of
 * it in one decode; the accepted prefix is attributed to its sources, so a rejected suffix
 * tail never counts against MTP (and the other way round).
 *
 * @module
 */
import { UsageError } from "./errors.ts";

/** Which proposers feed the verify step (`none`: target-only decoding). */
export type SpeculationMode = "none" | "mtp" | "suffix" | "mtp+suffix";

export const SPECULATION_MODES: readonly SpeculationMode[] = [
  "none",
  "mtp",
  "suffix",
  "mtp+suffix",
];

/** Parses a `--speculation` value; throws UsageError naming the valid ones. */
export function parseSpeculationMode(value: string): SpeculationMode {
  const v = value.trim() as SpeculationMode;
  if (!SPECULATION_MODES.includes(v)) {
    throw new UsageError(`Unknown speculation mode "${value}"`, {
      hint: `use one of ${SPECULATION_MODES.join(", ")}`,
    });
  }
  return v;
}

export function usesMtp(mode: SpeculationMode): boolean {
  return mode === "mtp" || mode === "mtp+suffix";
}

export function usesSuffix(mode: SpeculationMode): boolean {
  return mode === "suffix" || mode === "mtp+suffix";
}

/**
 * Why a session that asked for speculation decodes target-only (or without one source),
 * named in output and telemetry: there is no silent fallback.
 */
export type SpeculationFallback =
  /** MTP asked for, but the model has no MTP layers (or they were not loaded). */
  | "mtp-unavailable"
  /** MTP asked for, but the draft state did not verify (position or pending row missing). */
  | "mtp-not-ready"
  /** The target's recurrent memory has neither native rollback nor a checkpoint path. */
  | "rollback-unavailable"
  /**
   * The session was committed in the decode worker's shared batched context and no context of
   * its own could be opened to speculate on (see `SpeculationRoute`): it decodes target-only
   * in the batch.
   */
  | "batched-decode";

/**
 * Why the speculative loop ran on a context other than the one the session was committed in.
 * `batch-to-session`: the session was committed in the shared batched context, where a verify
 * of k+1 rows and a per-sequence rollback are not available, so its sequence state (KV and
 * recurrent state) was copied into a context of its own, which speculates and decodes alone.
 */
export type SpeculationRoute = "batch-to-session";

/** Acceptance counters per source; token counts, never token values. */
export interface SpeculationCounters {
  /** Verify decodes (one target llama_decode of 1 + drafts positions each). */
  rounds: number;
  mtpDrafted: number;
  mtpAccepted: number;
  suffixDrafted: number;
  suffixAccepted: number;
  /** Positions rolled back after a rejection (target context). */
  rolledBack: number;
}

export function emptyCounters(): SpeculationCounters {
  return {
    rounds: 0,
    mtpDrafted: 0,
    mtpAccepted: 0,
    suffixDrafted: 0,
    suffixAccepted: 0,
    rolledBack: 0,
  };
}

/**
 * Greedy acceptance: the number of drafts accepted, given the target's argmax after each
 * verified row. `targetNext[i]` is the target's token after row i (row 0 is the committed
 * token, row i+1 is draft i); draft i is accepted while every earlier one was and
 * `targetNext[i] === drafts[i]`.
 */
export function acceptGreedy(targetNext: ArrayLike<number>, drafts: ArrayLike<number>): number {
  let a = 0;
  while (a < drafts.length && a < targetNext.length && targetNext[a] === drafts[a]) a++;
  return a;
}

/**
 * Adds one round to the counters: a proposal of `mtpDrafted` MTP tokens followed by
 * `suffixDrafted` suffix tokens, of which the first `accepted` were accepted.
 */
export function countRound(
  counters: SpeculationCounters,
  mtpDrafted: number,
  suffixDrafted: number,
  accepted: number,
): void {
  counters.rounds++;
  counters.mtpDrafted += mtpDrafted;
  counters.suffixDrafted += suffixDrafted;
  counters.mtpAccepted += Math.min(accepted, mtpDrafted);
  counters.suffixAccepted += Math.max(0, accepted - mtpDrafted);
  counters.rolledBack += mtpDrafted + suffixDrafted - accepted;
}

/** Accepted over drafted, or null when nothing was drafted. */
export function acceptanceRate(accepted: number, drafted: number): number | null {
  return drafted === 0 ? null : accepted / drafted;
}
