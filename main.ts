/**
 * skippy-disagg: phase-disaggregated LLM serving on llama.cpp.
 *
 * Entry point only: builds the command tree (cli/) and turns expected errors into one-line
 * messages with a non-zero exit code. `--debug` (or SKIPPY_DEBUG=1) shows stack traces.
 */
import { runCli } from "./cli/program.ts";

if (import.meta.main) {
  Deno.exit(await runCli(Deno.args));
}
