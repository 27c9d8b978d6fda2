/**
 * The speculative decode loop on one sequence of a per-session context (the `--batching off`
 * path): propose drafts (an MTP prefix, then a suffix-proposer tail), verify them with one
 * target decode of 1 + k positions, accept the longest prefix the target agrees with, roll the
 * rest back in the target (ffi/verify.ts) and in the MTP draft (ffi/mtp.ts), and continue
 * from the last kept row. Acceptance is the request's sampler's (core/speculative_sampling.ts):
 * argmax agreement when greedy; with temperature > 0 the standard speculative rule for
 * deterministic drafts (accept a draft with the target's probability of it, on rejection draw
 * from the residual), carried out by sampling the target at each row with that position's
 * draw and accepting a draft equal to the sample. The sampler state stays the project's own
 * exportable `{ seed, draws }`, one draw per token.
 *
 * Tokens equal target-only decoding's, greedy or seeded sampling; the logits they are taken
 * from may differ from a single-token decode's in the last bits (a verify batch rounds
 * differently), which is why equality is asserted on tokens.
 *
 * The loop starts from "logits after the last committed token, which the target has
 * decoded", the state both a committed handoff (after its probe step) and colocated
 * generation (after the first token's own step) are in; so the drafts after a handoff are
 * the colocated ones, bit for bit.
 */
import {
  countRound,
  emptyCounters,
  type SpeculationCounters,
  type SpeculationFallback,
  type SpeculationMode,
  type SpeculationRoute,
  usesMtp,
  usesSuffix,
} from "../core/speculation.ts";
import { type SamplerState, sampleToken, type SamplingParams } from "../core/sampling.ts";
import { speculativeRound } from "../core/speculative_sampling.ts";
import { type SuffixOptions, SuffixProposer } from "../core/suffix.ts";
import type { MtpDraft, MtpReadiness } from "../ffi/mtp.ts";
import { type RollbackKind, rollbackKind, Verifier } from "../ffi/verify.ts";
import type { Engine } from "./engine.ts";

/** How a session speculates; every bound in tokens. */
export interface SpeculationConfig {
  mode: SpeculationMode;
  /** Most drafts per verify (MTP prefix plus suffix tail); also the context's `n_rs_seq`. */
  draftTokensMax: number;
  /** Most MTP drafts per verify (the draft head runs once per draft). */
  mtpDraftTokensMax: number;
  suffix?: Partial<SuffixOptions>;
}

export const SPECULATION_DEFAULTS: Readonly<SpeculationConfig> = {
  mode: "none",
  draftTokensMax: 4,
  mtpDraftTokensMax: 2,
};

/** Largest `draftTokensMax` accepted (one verify decode is 1 + this many rows). */
export const DRAFT_TOKENS_LIMIT = 16;

/** What the session's speculation did: for telemetry and `--json`, never token values. */
export interface SpeculationReport {
  mode: SpeculationMode;
  /** How rejected positions were rolled back, or null when nothing was verified. */
  rollback: RollbackKind | null;
  /** MTP readiness as verified when the loop started (null: the mode uses no MTP). */
  mtpReadiness: MtpReadiness | null;
  /** Why a source (or all speculation) was not used; null when everything asked for ran. */
  fallback: SpeculationFallback | null;
  /** Why the loop ran on another context than the session's own; null: it did not. */
  route: SpeculationRoute | null;
  counters: SpeculationCounters;
}

/** The `nRsSeq` a target context needs for `config` (0 without speculation). */
export function nRsSeqFor(config: Pick<SpeculationConfig, "mode" | "draftTokensMax">): number {
  return config.mode === "none" ? 0 : config.draftTokensMax;
}

/** Observers for tests and the correctness harness (never logged). */
export interface SpeculationHooks {
  /** Each round's MTP drafts and the draft logits they were taken from. */
  onMtpDraft?: (tokens: number[], logits: Float32Array[]) => void;
}

/** One emitted token and the logits it was taken from. */
export interface SpeculativeStep {
  token: number;
  logits: Float32Array;
}

export class SpeculativeDecoder {
  readonly report: SpeculationReport;
  readonly #suffix: SuffixProposer | null;
  readonly #verifier: Verifier | null;
  #mtp: MtpDraft | null;
  readonly #lastToken: number;

  /**
   * `history`: every committed token the target holds (the prompt, then generated tokens,
   * the last one included); the suffix index is built from it.
   */
  constructor(
    readonly engine: Engine,
    draft: MtpDraft | null,
    history: ArrayLike<number>,
    readonly sampling: SamplingParams,
    readonly config: SpeculationConfig,
    readonly hooks: SpeculationHooks = {},
  ) {
    const report: SpeculationReport = {
      mode: config.mode,
      rollback: null,
      mtpReadiness: null,
      fallback: null,
      route: null,
      counters: emptyCounters(),
    };
    this.report = report;
    this.#lastToken = history.length > 0 ? history[history.length - 1] : -1;
    const active = config.mode !== "none";
    this.#mtp = null;
    if (active && usesMtp(config.mode)) {
      if (draft === null) report.fallback = "mtp-unavailable";
      else {
        report.mtpReadiness = draft.readiness(engine.position);
        if (report.mtpReadiness === "not-ready") report.fallback = "mtp-not-ready";
        else this.#mtp = draft;
      }
    }
    this.#suffix = active && usesSuffix(config.mode)
      ? new SuffixProposer(history, { ...config.suffix, draftTokensMax: config.draftTokensMax })
      : null;
    const kind = active ? rollbackKind(engine.ctx, config.draftTokensMax) : null;
    if (active && kind === null) report.fallback = "rollback-unavailable";
    this.#verifier = active && kind !== null && (this.#mtp || this.#suffix)
      ? new Verifier(engine.ctx, config.draftTokensMax)
      : null;
    report.rollback = this.#verifier?.kind ?? null;
  }

  /**
   * Yields up to `n` tokens continuing from `logits` (after the last committed token, which
   * the target has decoded), stopping after an end-of-generation token. Target-only when no
   * proposer is active.
   */
  async *generate(
    logits: Float32Array,
    n: number,
    sampler: SamplerState,
  ): AsyncGenerator<SpeculativeStep> {
    const vocab = this.engine.model.vocab;
    if (this.#verifier === null) {
      let current = logits;
      for (let i = 0; i < n; i++) {
        const token = sampleToken(current, this.sampling, sampler);
        yield { token, logits: current };
        if (vocab.isEog(token) || i === n - 1) return;
        current = await this.engine.step(token);
      }
      return;
    }
    if (this.#mtp && this.report.mtpReadiness === "lagging-one") {
      // The last committed token was decoded by the target alone (the handoff's probe, or
      // the first token's step): its draft row is caught up from that decode's hidden row.
      const pos = this.engine.position - 1;
      await this.#mtp.catchUp(Int32Array.of(this.#lastToken), pos);
    }
    let current = logits;
    // The token already sampled from `current` by the last round (sampled mode), else null.
    let pending: number | null = null;
    let emitted = 0;
    while (emitted < n) {
      const t = pending ?? sampleToken(current, this.sampling, sampler);
      pending = null;
      yield { token: t, logits: current };
      emitted++;
      if (vocab.isEog(t) || emitted === n) return;
      const pos = this.engine.position;
      const room = Math.min(
        this.config.draftTokensMax,
        n - emitted,
        this.engine.ctx.nCtx - pos - 1,
      );
      const { mtpTokens, suffixTokens } = await this.#propose(t, pos, room);
      const drafts = [...mtpTokens, ...suffixTokens];
      const rows = await this.#verifier.verify([t, ...drafts], pos);
      const { accepted: a, next } = speculativeRound(rows.logits, drafts, this.sampling, sampler);
      countRound(this.report.counters, mtpTokens.length, suffixTokens.length, a);
      const replayed = await this.#verifier.keep(a + 1);
      this.engine.adoptPosition(pos + a + 1);
      const accepted = drafts.slice(0, a);
      await this.#mtp?.acceptVerified(t, accepted, pos);
      this.#suffix?.append([t, ...accepted]);
      for (let i = 0; i < a; i++) {
        yield { token: accepted[i], logits: rows.logits[i] };
        emitted++;
        if (vocab.isEog(accepted[i]) || emitted === n) return;
      }
      // Sampled: `next` took its draw from row a (the draw of its position), so it is kept.
      // Greedy: argmax again at the top, of the replayed row where the rollback recomputed it
      // (checkpoint), as before.
      const greedy = this.sampling.temperature <= 0;
      current = greedy ? replayed ?? rows.logits[a] : rows.logits[a];
      pending = greedy ? null : next;
    }
  }

  /**
   * The round's proposal: the MTP prefix, then the suffix proposer's tail continuing after
   * it. When the MTP prefix leaves the suffix proposer no match but the committed history
   * alone gives one, the suffix's own proposal is used instead (evidence from the request's
   * tokens beats an unconfirmed MTP guess); MTP's drafts are then not proposed and not
   * counted as drafted.
   */
  async #propose(t: number, pos: number, room: number) {
    let mtpTokens: number[] = [];
    if (this.#mtp && room > 0) {
      const m = Math.min(this.config.mtpDraftTokensMax, room);
      const drafted = await this.#mtp.propose(t, pos, m);
      this.hooks.onMtpDraft?.(drafted.tokens, drafted.logits);
      mtpTokens = drafted.tokens;
    }
    let suffixTokens: number[] = [];
    if (this.#suffix) {
      const rest = room - mtpTokens.length;
      if (rest > 0) suffixTokens = this.#suffix.propose(rest, [t, ...mtpTokens]);
      if (suffixTokens.length === 0 && mtpTokens.length > 0) {
        const own = this.#suffix.propose(room, [t]);
        if (own.length > 0) return { mtpTokens: [], suffixTokens: own };
      }
    }
    return { mtpTokens, suffixTokens };
  }
}

/** The telemetry event of a finished session's speculation (counts only). */
export function speculationEvent(report: SpeculationReport, atMs: number) {
  return {
    type: "speculation" as const,
    atMs,
    mode: report.mode,
    rollback: report.rollback,
    mtpReadiness: report.mtpReadiness,
    fallback: report.fallback,
    route: report.route,
    ...report.counters,
  };
}

/**
 * Prefills `prompt` and, with an MTP draft, catches the draft up after every chunk from the
 * target's nextn rows (what the prefill worker does before it exports the draft's pages).
 */
export async function prefillWithDraft(
  engine: Engine,
  draft: MtpDraft | null,
  prompt: Int32Array,
): Promise<Float32Array> {
  return await engine.prefill(prompt, async ({ p0, p1 }) => {
    await draft?.catchUp(prompt.subarray(p0, p1), p0);
  });
}

/** A speculative run in progress: its steps, and its report once the loop has started. */
export interface SpeculativeRun {
  steps: AsyncGenerator<SpeculativeStep>;
  /** Filled when the loop starts (after the first token's step). */
  report: () => SpeculationReport | null;
}

/**
 * Colocated speculative generation, shaped like the decoder's path after a handoff: the first
 * token is sampled from the prompt's logits and decoded alone (on a decoder that is the
 * prefiller's token and the continuation probe), then the speculative loop continues.
 * `promptLogits` come from `prefillWithDraft`.
 */
export function runColocated(
  engine: Engine,
  draft: MtpDraft | null,
  prompt: Int32Array,
  promptLogits: Float32Array,
  n: number,
  sampling: SamplingParams,
  sampler: SamplerState,
  config: SpeculationConfig,
): SpeculativeRun {
  let decoder: SpeculativeDecoder | null = null;
  const steps = async function* (): AsyncGenerator<SpeculativeStep> {
    if (n <= 0) return;
    const first = sampleToken(promptLogits, sampling, sampler);
    yield { token: first, logits: promptLogits };
    if (engine.model.vocab.isEog(first) || n === 1) return;
    const logits = await engine.step(first);
    decoder = new SpeculativeDecoder(engine, draft, [...prompt, first], sampling, config);
    yield* decoder.generate(logits, n - 1, sampler);
  };
  return { steps: steps(), report: () => decoder?.report ?? null };
}
