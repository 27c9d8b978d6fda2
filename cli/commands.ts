/** The registry of top-level commands: one line per command file. */
import type { Command } from "commander";
import { register as registerGenerate } from "./generate.ts";
import { register as registerModel } from "./model.ts";
import { register as registerIdentity } from "./identity.ts";
import { register as registerTrust } from "./trust.ts";
import { register as registerState } from "./state.ts";
import { register as registerCorrectness } from "./correctness.ts";
import { register as registerServe } from "./serve.ts";
import { register as registerHandoff } from "./handoff.ts";
import { register as registerDemo } from "./demo.ts";
import { register as registerStats } from "./stats.ts";
import { register as registerCoordinate } from "./coordinate.ts";
import { register as registerPlan } from "./plan.ts";
import { measureStateBytes } from "./_runtime_probe.ts";

export type RegisterCommand = (program: Command) => void;

export const COMMANDS: RegisterCommand[] = [
  (program) => registerModel(program, measureStateBytes),
  registerGenerate,
  registerIdentity,
  registerTrust,
  registerState,
  registerCorrectness,
  registerServe,
  registerHandoff,
  registerDemo,
  registerStats,
  registerCoordinate,
  registerPlan,
];
