/** The registry of top-level commands: one line per command file. */
import type { Command } from "commander";
import { register as registerGenerate } from "./generate.ts";

export type RegisterCommand = (program: Command) => void;

export const COMMANDS: RegisterCommand[] = [registerGenerate];
