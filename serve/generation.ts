/**
 * Generation on the decoder after a committed handoff: the first token came with the state,
 * the logits after it came from the continuation probe, and from there the loop is the same
 * as colocated generation (serve/engine.ts).
 */
import { type SamplerPayload, sampleToken } from "../core/mod.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import type { DecodeEngine } from "./engine.ts";
import type { MtpDraft } from "../ffi/mtp.ts";
import { SPECULATION_DEFAULTS, type SpeculationReport } from "./speculative.ts";
import type { SpeculationMode } from "../core/speculation.ts";
import { continueSpeculative } from "./speculative_session.ts";

/** A committed session, ready to generate: everything the decode loop continues from. */
export interface CommittedSession {
  handoffId: string;
  tenantId: string;
  engine: DecodeEngine;
  draft: MtpDraft | null;
  history: Int32Array;
  firstToken: number;
  /** Logits after decoding the first token (from the probe): the second token samples these. */
  nextLogits: Float32Array;
  sampler: SamplerPayload;
  events: DecoderTelemetryEvent[];
  mtpReady: boolean | null;
  /** This request's speculation mode, overriding the worker's (GenerateRequest.speculation). */
  speculationMode?: SpeculationMode;
  /** Set by the speculative loop when it ran (serve/speculative_session.ts). */
  speculation?: SpeculationReport;
}

export interface GeneratedStep {
  token: number;
  /** The logits the token was sampled from; null for the first token (sampled by the prefiller). */
  logits: Float32Array | null;
}

/** Yields `n` tokens (fewer at end of generation) continuing a committed session. */
export async function* continueSession(
  session: CommittedSession,
  n: number,
): AsyncGenerator<GeneratedStep> {
  if (n <= 0) return;
  const base = session.engine.config.speculation ?? SPECULATION_DEFAULTS;
  const mode = session.speculationMode ?? base.mode;
  // Speculation verifies and rolls back on a context of its own: a session of the shared
  // batched context is routed to one (serve/speculative_session.ts).
  if (mode !== "none") return yield* continueSpeculative(session, n, { ...base, mode });
  const vocab = session.engine.model.vocab;
  yield { token: session.firstToken, logits: null };
  if (vocab.isEog(session.firstToken)) return;
  const sampler = { ...session.sampler.state };
  let logits = session.nextLogits;
  for (let i = 1; i < n; i++) {
    const token = sampleToken(logits, session.sampler.params, sampler);
    yield { token, logits };
    if (vocab.isEog(token) || i === n - 1) return;
    logits = await session.engine.step(token);
  }
}
