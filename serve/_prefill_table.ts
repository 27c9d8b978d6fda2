/**
 * Where one prefill handoff (serve/prefill_session.ts) meets the prefiller transition table
 * (core/handoff_prefiller.ts) at its two ends: the table's first state, made from the request,
 * and the PrefillOutcome the handoff answers with once the table has ended, including the
 * fallback a prefill worker completes itself when its decode worker was lost before the commit.
 */
import {
  type AbortReason,
  contextTokensNeeded,
  createPrefiller,
  type PrefillerState,
  type SamplerState,
} from "../core/mod.ts";
import type { ExportResult } from "./exporter.ts";
import { describeAbort, type PrefillOutcome, type PrefillRequest } from "./messages.ts";
import { DECODER_LOST, type PrefillCompletion } from "./prefill_completion.ts";
import type { PrefillHandoffInput } from "./_prefill_input.ts";

/** The prefiller table's first state for this handoff. */
export function prefillerFor(input: PrefillHandoffInput): PrefillerState {
  const r = input.request;
  const n = input.prompt.length;
  return createPrefiller({
    handoffId: r.handoffId,
    tenantId: r.tenantId,
    sourceNodeId: input.sourceNodeId,
    destNodeId: r.decode.nodeId,
    identityDigest: input.identity.digest,
    family: input.identity.numerical.family,
    promptTokens: n,
    stateBytesEstimate: 0,
    contextTokensNeeded: contextTokensNeeded({
      promptTokens: n,
      generateTokensMax: r.generateTokens + 1,
      draftTokensMax: 0,
    }),
  }, input.timing);
}

/** The outcome of a handoff, its telemetry not yet added (see `PrefillHandoff.run`). */
export function prefillOutcome(
  handoffId: string,
  promptTokens: number,
  outcome: PrefillOutcome["outcome"],
  reason: AbortReason | null,
  message: string | null,
): PrefillOutcome {
  const head = { type: "PrefillOutcome" as const, handoffId, outcome, reason, message };
  const out: PrefillOutcome = { ...head, promptTokens, telemetry: null };
  return out;
}

/**
 * Whether the table ended without a commit because the decode worker was lost, for a request
 * whose coordinator asked the prefill worker to complete it then.
 */
export function lostDecoderToComplete(
  request: PrefillRequest,
  outcome: PrefillOutcome | null,
): boolean {
  const o = outcome;
  return request.completeOnDecoderLoss === true && o !== null && o.outcome !== "committed" &&
    o.reason !== null && DECODER_LOST.has(o.reason);
}

/**
 * The request completes on this worker from the state it holds (the whole prompt and the
 * first token): the fallback outcome the coordinator hears, and what generation continues from.
 */
export function completedHere(
  o: PrefillOutcome,
  done: { result: ExportResult; sampler: SamplerState },
  seed: number,
): { outcome: PrefillOutcome; completion: PrefillCompletion } {
  const completion = {
    firstToken: done.result.firstToken,
    nextLogits: done.result.probeLogits,
    sampler: { ...done.sampler, seed },
  };
  const why = o.message ?? describeAbort(o.reason!);
  const outcome: PrefillOutcome = {
    ...o,
    outcome: "fallback",
    message: `decoder lost before commit (${why}); completed on the prefill worker`,
    completedHere: true,
  };
  return { outcome, completion };
}
