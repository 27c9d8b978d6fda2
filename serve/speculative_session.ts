/**
 * Speculative continuation of a committed handoff on the decoder (the per-session-context
 * path): the first token came with the state and the probe decoded it alone, so the target
 * holds prompt + first token and the MTP draft, when verified, is one token behind
 * (`lagging-one`); the suffix index is rebuilt from the handoff's history plus the first
 * token. From there it is the same loop as colocated generation (serve/speculative.ts), which
 * is why the drafts equal the colocated ones bit for bit.
 */
import { Engine } from "./engine.ts";
import type { CommittedSession, GeneratedStep } from "./generation.ts";
import { type SpeculationConfig, SpeculativeDecoder } from "./speculative.ts";

/** Yields `n` tokens (fewer at end of generation); sets `session.speculation` when it runs. */
export async function* continueSpeculative(
  session: CommittedSession,
  n: number,
  config: SpeculationConfig,
): AsyncGenerator<GeneratedStep> {
  if (n <= 0) return;
  const { engine } = session;
  yield { token: session.firstToken, logits: null };
  if (engine.model.vocab.isEog(session.firstToken) || n === 1) return;
  const history = [...session.history, session.firstToken];
  const params = session.sampler.params;
  // Speculation verifies and rolls back on a context of its own (generation.ts never sends a
  // session of the shared batched context here).
  if (!(engine instanceof Engine)) throw new Error("speculation needs a per-session context");
  const decoder = new SpeculativeDecoder(engine, session.draft, history, params, config);
  session.speculation = decoder.report;
  const sampler = { ...session.sampler.state };
  yield* decoder.generate(session.nextLogits, n - 1, sampler);
}
