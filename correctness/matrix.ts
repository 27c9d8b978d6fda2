/**
 * The handoff matrix: families x prompt lengths x page sizes, each case prefilled once on A and
 * handed to a fresh decoder context per variant:
 *
 * - `in-order`: pages as exported, then the end-of-prompt components, commit, continue: exact;
 * - `shuffled`: pages in a seeded shuffled order: still exact (the shim places cells at their
 *   source indices);
 * - `missing-page`: one page left out: refused at commit, naming the page's range;
 * - `flipped-byte`: one page with one flipped bit: refused when it arrives, by its checksum;
 * - `prefix-assisted`: the prompt prefilled after a prefix-cache hit on an earlier prompt
 *   sharing 75% of it (prefix_assisted.ts): exact against the cold run.
 *
 * A refused variant must leave the import uncommitted, decode through it must throw, and
 * nothing is generated; the import is then aborted and the decoder's sequence must be empty.
 */
import { SkippyError, StateValidationError } from "../core/errors.ts";
import { formatRange } from "../core/schema.ts";
import { type GpuLayersRequest, type StagedImport, summarizePage } from "../ffi/mod.ts";
import { FAMILIES, type Family, type Preset } from "../models/mod.ts";
import { RUNTIME_DEFAULTS, type RuntimeConfig } from "../serve/engine.ts";
import {
  adoptHandoff,
  assertUnusable,
  compareContinuations,
  type Continuation,
  continueGreedy,
  DecoderModel,
  openHandoff,
  type Parity,
  type PrefillResult,
  prefillSide,
  Side,
  stageAndCommit,
  type StagePlan,
  syntheticPrompt,
} from "./state_handoff.ts";
import { prefixAssistedVariant } from "./prefix_assisted.ts";

export const VARIANTS = [
  "in-order",
  "shuffled",
  "missing-page",
  "flipped-byte",
  "prefix-assisted",
] as const;
export type Variant = typeof VARIANTS[number];

export interface MatrixCase {
  family: Family;
  preset: Preset;
  promptTokens: number;
  pageTokens: number;
}

export interface MatrixOptions {
  /** Greedy tokens compared after the handoff. */
  steps: number;
  variants: readonly Variant[];
  /** Path of the model file of a family and preset (made on first use by the caller). */
  modelFor: (family: Family, preset: Preset) => Promise<string>;
  threads?: number;
  /** GPU offload on both sides (default "auto": all layers when there is a GPU device). */
  gpuLayers?: GpuLayersRequest;
  /** Flash attention on both sides (default off, the Engine default). */
  flashAttention?: boolean;
  digestCacheFile?: string;
}

/** Bytes of each component A sent (kv-page split into K/V rows and everything else). */
export interface ComponentBytes {
  kvRows: number;
  kvMeta: number;
  conv: number;
  ssm: number;
  /** A recurrent snapshot whose layout did not split into conv and ssm. */
  recurrentWhole: number;
  swa: number;
  mtpKv: number;
  mtpHidden: number;
  firstToken: number;
  total: number;
}

export type Verdict =
  | "exact"
  | "differs"
  | "refused"
  | "wrong-refusal"
  | "not-refused"
  | "no-hit"
  | "n/a";

export interface VariantResult {
  variant: Variant;
  verdict: Verdict;
  /** Parity of the continuation (exactness variants that committed). */
  parity: Parity | null;
  /** The refusal (or the reason a variant does not apply); never content. */
  detail: string | null;
  /** Tokens B generated (0 for every refused variant). */
  generated: number;
  importPagesUs: number;
  importFinalUs: number;
}

export interface CaseResult extends MatrixCase {
  /** KV pages A exported (one per prefill chunk; none for a recurrent model). */
  pages: number;
  bytes: ComponentBytes;
  prefillMs: number;
  exportPagesUs: number;
  exportFinalUs: number;
  variants: VariantResult[];
  /** Every variant passed (exact, or refused as required). */
  ok: boolean;
}

/** Prompt lengths per family in the full matrix: 32K and 64K stop short of the models' */
/** training contexts (32768 / 65536 tokens) so the continuation still fits. */
export function defaultPromptTokens(family: Family): number[] {
  return family === "hybrid" ? [1024, 8192, 32000, 64000] : [1024, 8192, 32000];
}

export const DEFAULT_PAGE_TOKENS = [256, 2048] as const;

/** The full matrix: every family at its default prompt lengths and both page sizes. */
export function defaultMatrix(preset: Preset = "tiny"): MatrixCase[] {
  return FAMILIES.flatMap((family) =>
    defaultPromptTokens(family).flatMap((promptTokens) =>
      DEFAULT_PAGE_TOKENS.map((pageTokens) => ({ family, preset, promptTokens, pageTokens }))
    )
  );
}

/** Context size of both sides of a case: the prompt and the continuation, in 256s. */
export function caseContextTokens(c: MatrixCase, steps: number): number {
  return Math.ceil((c.promptTokens + steps + 1) / 256) * 256;
}

/** The runtime both sides of `c` use (the Engine defaults unless `options` say otherwise). */
export async function caseConfig(
  c: MatrixCase,
  options: Pick<
    MatrixOptions,
    "steps" | "modelFor" | "threads" | "flashAttention" | "gpuLayers"
  >,
): Promise<RuntimeConfig> {
  return {
    ...RUNTIME_DEFAULTS,
    modelPath: await options.modelFor(c.family, c.preset),
    nCtx: caseContextTokens(c, options.steps),
    chunkTokens: c.pageTokens,
    threads: options.threads ?? RUNTIME_DEFAULTS.threads,
    flashAttention: options.flashAttention ?? RUNTIME_DEFAULTS.flashAttention,
    mtp: c.family === "hybrid-moe-mtp",
    swaFull: false,
    gpuLayers: options.gpuLayers ?? "auto",
  };
}

/** Runs one case: prefill on A once, then each variant into a fresh context on B's model. */
export async function runCase(c: MatrixCase, options: MatrixOptions): Promise<CaseResult> {
  const config = await caseConfig(c, options);
  using a = await Side.open(config, { digestCacheFile: options.digestCacheFile });
  using bModel = await DecoderModel.load(config);
  const tokens = syntheticPrompt(c.promptTokens, a.engine.model.vocab.nTokens, c.pageTokens);
  const prefill = await prefillSide(a, tokens);
  const reference = await continueGreedy(a, prefill.firstToken, options.steps);
  const variants: VariantResult[] = [];
  for (const variant of options.variants) {
    using b = await bModel.openSide(options.digestCacheFile);
    variants.push(
      variant === "prefix-assisted"
        ? await prefixAssistedVariant(a, b, c.family, tokens, reference, options.steps)
        : await runVariant(variant, a, b, prefill, reference, options.steps),
    );
  }
  const s = prefill.state;
  return {
    ...c,
    pages: s.pages.length,
    bytes: componentBytes(prefill),
    prefillMs: s.prefillMs,
    exportPagesUs: s.pageExportUs.reduce((n, x) => n + x, 0),
    exportFinalUs: s.finalExportUs,
    variants,
    ok: variants.every((v) => PASSING.has(v.verdict)),
  };
}

const PASSING: ReadonlySet<Verdict> = new Set(["exact", "refused", "n/a"]);

/** Runs `cases` in order; `onCase` hears about each case before it starts. */
export async function runMatrix(
  cases: readonly MatrixCase[],
  options: MatrixOptions,
  onCase?: (index: number, c: MatrixCase) => void,
): Promise<CaseResult[]> {
  const out: CaseResult[] = [];
  for (const [i, c] of cases.entries()) {
    onCase?.(i, c);
    out.push(await runCase(c, options));
  }
  return out;
}

interface Expectation {
  plan: StagePlan;
  /** Null: the handoff must commit and continue exactly. Otherwise the refusal to expect. */
  refusal: RegExp | null;
}

/** What a variant stages and expects, or why it does not apply to this state. */
function expectation(variant: Variant, p: PrefillResult): Expectation | string {
  const pages = p.state.pages.length;
  const all = [...Array(pages).keys()];
  const mid = Math.floor(pages / 2);
  if (variant === "in-order") return { plan: {}, refusal: null };
  if (pages === 0) return "no KV pages: the state is the conv/ssm snapshot alone";
  const range = summarizePage(p.state.pages[mid]);
  const what = escape(`kv-page tokens ${formatRange([range.p0, range.p1])}`);
  if (variant === "shuffled") {
    return pages < 2
      ? "one page: no other order"
      : { plan: { order: shuffle(all) }, refusal: null };
  }
  if (variant === "missing-page") {
    return {
      plan: { order: all.filter((i) => i !== mid) },
      refusal: new RegExp(`${what} missing`),
    };
  }
  return { plan: { flipPage: mid }, refusal: new RegExp(`${what}.*checksum`) };
}

async function runVariant(
  variant: Variant,
  a: Side,
  b: Side,
  prefill: PrefillResult,
  reference: Continuation,
  steps: number,
): Promise<VariantResult> {
  const result: VariantResult = {
    variant,
    verdict: "n/a",
    parity: null,
    detail: null,
    generated: 0,
    importPagesUs: 0,
    importFinalUs: 0,
  };
  const expected = expectation(variant, prefill);
  if (typeof expected === "string") return { ...result, detail: expected };
  const n = prefill.state.nTokens;
  const imp = await openHandoff(b, a.identity, n, steps);
  let refusal: Error | null = null;
  try {
    const t = await stageAndCommit(imp, prefill.state, expected.plan);
    result.importPagesUs = t.pagesUs;
    result.importFinalUs = t.finalUs;
    adoptHandoff(b, n, t.mtpHidden);
  } catch (error) {
    if (!(error instanceof SkippyError)) throw error;
    refusal = error;
  }
  if (refusal) return await refused(result, expected.refusal, refusal, imp, b);
  if (expected.refusal) return { ...result, verdict: "not-refused" };
  const moved = await continueGreedy(b, prefill.firstToken, steps);
  const parity = compareContinuations(reference, moved);
  return {
    ...result,
    parity,
    generated: moved.tokens.length,
    verdict: parity.exact ? "exact" : "differs",
  };
}

/**
 * A refusal: checks it is the expected one, that it left the import uncommitted and B unable to
 * decode, that B evaluated nothing, and that aborting empties B's sequence.
 */
async function refused(
  result: VariantResult,
  expected: RegExp | null,
  error: Error,
  imp: StagedImport,
  b: Side,
): Promise<VariantResult> {
  const matches = expected !== null && error instanceof StateValidationError &&
    expected.test(error.message);
  await assertUnusable(imp, b);
  await imp.abort();
  if (b.engine.ctx.seqPosMax(0) !== -1) {
    throw new StateValidationError("An aborted import left state in the decoder's sequence");
  }
  for (const ctx of [b.engine.ctx, b.draft?.ctx]) {
    const perf = ctx?.perf();
    if (perf && perf.promptMs + perf.evalMs !== 0) {
      throw new StateValidationError("A refused handoff let the decoder evaluate tokens");
    }
  }
  return { ...result, verdict: matches ? "refused" : "wrong-refusal", detail: error.message };
}

/** Bytes of every component in `p`, as sent. */
export function componentBytes(p: PrefillResult): ComponentBytes {
  const s = p.state;
  const sum = (xs: number[]) => xs.reduce((n, x) => n + x, 0);
  const pages = s.pages.map(summarizePage);
  const r = s.recurrent;
  const bytes: ComponentBytes = {
    kvRows: sum(pages.map((x) => x.rowBytes)),
    kvMeta: sum(pages.map((x) => x.metaBytes)),
    conv: r?.layout === "split" ? r.conv.byteLength : 0,
    ssm: r?.layout === "split" ? r.ssm.byteLength : 0,
    recurrentWhole: r?.layout === "whole" ? r.blob.byteLength : 0,
    swa: s.swa?.byteLength ?? 0,
    mtpKv: sum(s.mtpPages.map((x) => x.byteLength)),
    mtpHidden: s.mtpHidden?.byteLength ?? 0,
    firstToken: 4,
    total: 0,
  };
  bytes.total = sum(Object.values(bytes));
  return bytes;
}

/** A seeded permutation of `xs` that is not the identity (for two or more items). */
export function shuffle(xs: readonly number[], seed = 0x9e3779b9): number[] {
  const out = [...xs];
  let s = seed >>> 0;
  const next = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  if (out.length > 1 && out.every((x, i) => x === xs[i])) out.reverse();
  return out;
}

function escape(s: string): string {
  return s.replace(/[[\]()]/g, (ch) => `\\${ch}`);
}
