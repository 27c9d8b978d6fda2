/**
 * The state-handoff parity harness. Reading order: `state_handoff.ts` (sides, identity gate,
 * staging, greedy continuation, bitwise comparison), `matrix.ts` (cases and variants),
 * `report.ts` (tables); `process_handoff.ts` (the same check across two worker processes);
 * `chaos.ts` (handoffs with a worker killed at seeded points: no request lost).
 */
export {
  CHAOS_DEFAULTS,
  type ChaosOptions,
  type ChaosTrial,
  formatTrial,
  KILL_POINTS,
  type KillPoint,
  noNodeDeadlineMs,
  runChaos,
} from "./chaos.ts";
export {
  adoptHandoff,
  assertUnusable,
  compareContinuations,
  type Continuation,
  continueGreedy,
  DecoderModel,
  flipped,
  openHandoff,
  type Parity,
  type PrefillResult,
  prefillSide,
  Side,
  stageAndCommit,
  type StagePlan,
  type StageTimings,
  syntheticPrompt,
} from "./state_handoff.ts";
export {
  caseConfig,
  caseContextTokens,
  type CaseResult,
  type ComponentBytes,
  componentBytes,
  DEFAULT_PAGE_TOKENS,
  defaultMatrix,
  defaultPromptTokens,
  type MatrixCase,
  type MatrixOptions,
  runCase,
  runMatrix,
  shuffle,
  type Variant,
  type VariantResult,
  VARIANTS,
  type Verdict,
} from "./matrix.ts";
export { formatNotes, formatSummary, formatTable, maxAbsDiff } from "./report.ts";
export {
  contextTokensFor,
  PROCESS_DEFAULTS,
  type ProcessCase,
  type ProcessCaseResult,
  type ProcessMatrixOptions,
  promptOf,
  runProcessMatrix,
} from "./process_handoff.ts";
