/**
 * Generation on the decoder after a committed handoff: the first token came with the state,
 * the logits after it came from the continuation probe, and from there the loop is the same
 * as colocated generation (serve/engine.ts).
 */
import { type SamplerPayload, sampleToken } from "../core/mod.ts";
import type { DecoderTelemetryEvent } from "../core/telemetry.ts";
import type { DecodeEngine } from "./engine.ts";
import type { MtpDraft } from "../ffi/mtp.ts";

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
