/**
 * The command tree. Each command lives in its own file under cli/ and exports
 * `register(program)`; this file only wires them together and owns error reporting.
 */
import { Command, CommanderError } from "commander";
import { SkippyError } from "../core/errors.ts";
import { COMMANDS } from "./commands.ts";

export const VERSION = "0.1.0";

/** Builds the full command tree. Exported so tests can parse argument lists without a process. */
export function buildProgram(): Command {
  const program = new Command()
    .name("skippy-disagg")
    .description(
      "Phase-disaggregated LLM serving: exact prefill-to-decode state handoff on llama.cpp",
    )
    .version(VERSION)
    .option("--debug", "show stack traces and native library logs")
    .exitOverride()
    .showHelpAfterError(false)
    .configureOutput({
      writeErr: (s) => Deno.stderr.writeSync(new TextEncoder().encode(s)),
    });
  for (const register of COMMANDS) register(program);
  return program;
}

/** Parses and runs `args`; returns the process exit code. Never throws for expected errors. */
export async function runCli(args: string[]): Promise<number> {
  const debug = args.includes("--debug") || Deno.env.get("SKIPPY_DEBUG") === "1";
  const program = buildProgram();
  try {
    await program.parseAsync(args, { from: "user" });
    return 0;
  } catch (error) {
    return reportError(error, debug);
  }
}

function reportError(error: unknown, debug: boolean): number {
  if (error instanceof CommanderError) {
    // Commander already printed its message (help and version exit with code 0).
    return error.exitCode === 0 ? 0 : 2;
  }
  if (error instanceof SkippyError) {
    console.error(`error: ${error.message}`);
    if (error.hint) console.error(`hint: ${error.hint}`);
    if (debug) console.error(error.stack);
    return error.exitCode;
  }
  const message = error instanceof Error ? error.message : String(error);
  console.error(`error: ${message}`);
  if (debug) console.error(error instanceof Error ? error.stack : "");
  else console.error("hint: rerun with --debug for the stack trace");
  return 1;
}
