/**
 * Speculative continuation of a committed handoff on the decoder: the first token came with
 * the state and the probe decoded it alone, so the target holds prompt + first token and the
 * MTP draft, when verified, is one token behind (`lagging-one`); the suffix index is rebuilt
 * from the handoff's history plus the first token. From there it is the same loop as colocated
 * generation (serve/speculative.ts), which is why the drafts equal the colocated ones bit for
 * bit.
 *
 * A session committed in the shared batched context (`serve --batching on`) is routed to a
 * context of its own first (`route: "batch-to-session"` in telemetry): a verify step decodes
 * k+1 rows of one sequence and rolls back the rejected ones, and on hybrid models that rollback
 * needs `n_rs_seq` recurrent snapshots, which the shared context does not keep for each of its
 * sequences (that would cost `sessionsMax * (k+1)` recurrent states). Its sequence state (KV
 * pages and the recurrent snapshot, as a handoff moves them) is copied into a fresh context with
 * the worker's numerics plus `n_rs_seq` (measured bitwise-neutral), which then decodes alone:
 * tokens equal colocated speculation's. The sequence stays reserved in the shared context until the request
 * ends, so admission still bounds requests to `sessionsMax`; each routed request holds one
 * more context while it generates.
 */
import { Engine } from "./engine.ts";
import { SequenceEngine } from "./batch_loop.ts";
import type { CommittedSession, GeneratedStep } from "./generation.ts";
import { nRsSeqFor, type SpeculationConfig, SpeculativeDecoder } from "./speculative.ts";
import { emptyCounters } from "../core/speculation.ts";
import { sampleToken } from "../core/sampling.ts";
import { exportKvPage, exportRecurrent, stateBackend } from "../ffi/state.ts";
import { StagedImport } from "../ffi/staged_import.ts";

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
  const sampler = { ...session.sampler.state };
  if (engine instanceof Engine) {
    const decoder = new SpeculativeDecoder(engine, session.draft, history, params, config);
    session.speculation = decoder.report;
    return yield* decoder.generate(session.nextLogits, n - 1, sampler);
  }
  if (!(engine instanceof SequenceEngine) || session.draft !== null) {
    throw new Error("Internal error: a batched session with an MTP draft, or an unknown engine");
  }
  let own: Engine;
  try {
    own = await routeToOwnContext(engine, config);
  } catch {
    // No context of its own (out of memory, or an ISWA session, which is not routed): decode
    // target-only in the batch, and name the fallback.
    session.speculation = {
      mode: config.mode,
      rollback: null,
      mtpReadiness: null,
      fallback: "batched-decode",
      route: null,
      counters: emptyCounters(),
    };
    let logits = session.nextLogits;
    for (let i = 1; i < n; i++) {
      const token = sampleToken(logits, params, sampler);
      yield { token, logits };
      if (engine.model.vocab.isEog(token) || i === n - 1) return;
      logits = await engine.step(token);
    }
    return;
  }
  using routed = own;
  const decoder = new SpeculativeDecoder(routed, null, history, params, config);
  decoder.report.route = "batch-to-session";
  session.speculation = decoder.report;
  yield* decoder.generate(session.nextLogits, n - 1, sampler);
}

/**
 * Opens a context of its own for `engine`'s sequence (the worker's numerics, plus the
 * recurrent snapshots speculation rolls back with) and moves the sequence's state into it the
 * way a handoff does, in process: attention KV as pages of at most `chunkTokens` positions,
 * then the recurrent snapshot, through a staged import that commits. (The public whole-sequence
 * state API cannot be used: a sequence of the shared context is one stream of several, and
 * llama.cpp refuses to load it into a one-stream context.) ISWA models are not routed.
 */
async function routeToOwnContext(
  engine: SequenceEngine,
  config: SpeculationConfig,
): Promise<Engine> {
  const own = await Engine.open(
    { ...engine.config, nCtx: engine.contextTokens, nRsSeq: nRsSeqFor(config) },
    engine.model,
  );
  try {
    const nTokens = engine.position;
    const seq = engine.seq;
    const kind = (await stateBackend(engine.ctx)).kind;
    if (kind === "iswa") throw new Error("sliding-window sessions are not routed");
    const imp = await StagedImport.open(own.ctx, { nTokens });
    const hasKv = kind === "kv" || kind === "hybrid";
    const step = Math.max(1, engine.config.chunkTokens);
    for (let p0 = 0; hasKv && p0 < nTokens; p0 += step) {
      const p1 = Math.min(nTokens, p0 + step);
      await imp.addPage(await exportKvPage(engine.ctx, p0, p1, { seq }));
    }
    if (kind === "hybrid" || kind === "recurrent") {
      await imp.setRecurrent(await exportRecurrent(engine.ctx, { seq }));
    }
    await imp.commit();
    own.adoptPosition(nTokens);
    return own;
  } catch (error) {
    own[Symbol.dispose]();
    throw error;
  }
}
