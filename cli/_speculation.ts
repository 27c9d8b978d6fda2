/**
 * `--speculation none|mtp|suffix|mtp+suffix` and its bounds, shared by `generate`, `serve`
 * and `handoff`. Speculation runs on per-session contexts (serve/speculative.ts); it never
 * changes the tokens of greedy or seeded sampled decoding (the speculative acceptance rule,
 * core/speculative_sampling.ts).
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { parseSpeculationMode, SPECULATION_MODES } from "../core/speculation.ts";
import type { SpeculationMode } from "../core/speculation.ts";
import {
  DRAFT_TOKENS_LIMIT,
  SPECULATION_DEFAULTS,
  type SpeculationConfig,
} from "../serve/speculative.ts";
import { intArg } from "./_options.ts";

export interface SpeculationFlags {
  speculation: SpeculationMode;
  draftTokens: number;
  mtpDraftTokens: number;
}

function modeArg(value: string): SpeculationMode {
  try {
    return parseSpeculationMode(value);
  } catch {
    throw new InvalidArgumentError(`expected one of ${SPECULATION_MODES.join(", ")}`);
  }
}

/** Adds --speculation, --draft-tokens and --mtp-draft-tokens. */
export function addSpeculationOptions(cmd: Command): Command {
  return cmd
    .addOption(
      new Option(
        "--speculation <mode>",
        "speculative decoding: none, mtp, suffix or mtp+suffix (tokens unchanged, greedy or seeded sampling)",
      ).argParser(modeArg).default(SPECULATION_DEFAULTS.mode),
    )
    .option(
      "--draft-tokens <n>",
      "most draft tokens verified per step (also the recurrent snapshots kept)",
      intArg(1, DRAFT_TOKENS_LIMIT),
      SPECULATION_DEFAULTS.draftTokensMax,
    )
    .option(
      "--mtp-draft-tokens <n>",
      "most MTP drafts per step (the rest of --draft-tokens goes to the suffix proposer)",
      intArg(1, DRAFT_TOKENS_LIMIT),
      SPECULATION_DEFAULTS.mtpDraftTokensMax,
    );
}

export function speculationConfigFrom(flags: SpeculationFlags): SpeculationConfig {
  return {
    mode: flags.speculation,
    draftTokensMax: flags.draftTokens,
    mtpDraftTokensMax: Math.min(flags.mtpDraftTokens, flags.draftTokens),
  };
}
