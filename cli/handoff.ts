/**
 * `handoff --prefill <peer> --decode <peer> --prompt-file <f> -n N [--json]`: scripts one
 * handoff from a shell, acting as its coordinator. Prints the generated text as it arrives and
 * a one-line telemetry summary on stderr, or one JSON object with text, tokens and telemetry.
 * A fallback to colocated generation is always said (stderr, and `placement` and
 * `fallbackReason` in the JSON); `--fallback` chooses whether it also fails the command.
 */
import { type Command, Option } from "commander";
import { HandoffAbortedError } from "../core/errors.ts";
import { formatTelemetry } from "../core/telemetry.ts";
import { SPECULATION_MODES, type SpeculationMode } from "../core/speculation.ts";
import { runHandoff } from "../serve/coordinator.ts";
import type { PeerAddress } from "../serve/messages.ts";
import { Node } from "../serve/node.ts";
import { addRequestOptions, intArg, readPrompt, type RequestFlags } from "./_options.ts";
import { peerArg } from "./_peers.ts";
import { listArg } from "./_list_args.ts";

interface HandoffFlags extends RequestFlags {
  prefill: PeerAddress;
  decode: PeerAddress;
  decodeAlternates: PeerAddress[];
  tenant: string;
  speculation?: SpeculationMode;
  stateDir?: string;
  timeoutMs: number;
  json: boolean;
  probe: boolean;
  fallback: "error" | "colocated";
}

export function register(program: Command): void {
  const cmd = program
    .command("handoff")
    .description("run one prefill-to-decode handoff and generate (acts as the coordinator)")
    .requiredOption("--prefill <peer>", "prefill worker, <node-id>@<host>:<port>", peerArg)
    .requiredOption("--decode <peer>", "decode worker, <node-id>@<host>:<port>", peerArg)
    .option(
      "--decode-alternates <peers>",
      "further decode workers (comma-separated) a request resumes on if its decoder is lost",
      listArg(peerArg),
      [],
    )
    .option("--tenant <id>", "tenant the request (and its state) belongs to", "default")
    .option("--state-dir <dir>", "this client's node identity and trust list (default: per-user)")
    .option(
      "--timeout-ms <ms>",
      "fail when the workers report no progress for this long (not a cap on the request's " +
        "length: a long generation streams tokens the whole time)",
      intArg(1, 86_400_000),
      120_000,
    )
    .addOption(
      new Option(
        "--fallback <mode>",
        "when the handoff falls back to colocated generation, still print the result and " +
          "then exit non-zero (error), or accept it (colocated). Default error: this command " +
          "exists to script a handoff, so a run without one must not pass unnoticed",
      ).choices(["error", "colocated"]).default("error"),
    )
    .addOption(
      new Option(
        "--speculation <mode>",
        "speculative decoding on the decoder for this request: none, mtp, suffix or " +
          "mtp+suffix (default: the decode worker's --speculation)",
      ).choices([...SPECULATION_MODES]),
    )
    .option("--json", "print one JSON object with text, tokens and telemetry", false)
    .option("--probe", "with --json: add a SHA-256 of every step's logits", false);
  addRequestOptions(cmd, 1).action((flags: HandoffFlags) => runHandoffCommand(flags));
}

async function runHandoffCommand(flags: HandoffFlags): Promise<void> {
  const prompt = await readPrompt(flags);
  const node = await Node.open(flags.stateDir);
  const out = new TextEncoder();
  const controller = new AbortController();
  const onSignal = () => controller.abort();
  Deno.addSignalListener("SIGINT", onSignal);
  try {
    const result = await runHandoff(node, {
      prefill: flags.prefill,
      decode: flags.decode,
      decodeAlternates: flags.decodeAlternates,
      prompt,
      generateTokens: flags.n,
      sampling: {
        temperature: flags.temperature,
        topK: flags.topK,
        topP: flags.topP,
        seed: flags.seed,
      },
      tenantId: flags.tenant,
      ...(flags.speculation ? { speculation: flags.speculation } : {}),
      probe: flags.probe,
      timeoutMs: flags.timeoutMs,
      signal: controller.signal,
      onText: flags.json ? undefined : (text) => Deno.stdout.writeSync(out.encode(text)),
    });
    if (flags.json) {
      console.log(JSON.stringify(result, null, 2));
    } else {
      Deno.stdout.writeSync(out.encode("\n"));
    }
    // Every fallback is said, one line each (a worker lost mid-request, resumed elsewhere).
    for (const f of result.fallbacks) {
      console.error(
        f.kind === "resumed"
          ? `handoff: resumed after ${f.tokensBefore} tokens on ${f.nodeId}: ${f.reason}`
          : `handoff: fell back to colocated generation: ${f.reason} [${f.kind}]`,
      );
    }
    if (!flags.json) console.error(`telemetry: ${formatTelemetry(result.telemetry)}`);
    if (result.placement !== "disaggregated" && flags.fallback === "error") {
      throw new HandoffAbortedError(
        "fallback",
        `The handoff did not happen: generation ran colocated (${result.fallbackReason})`,
        { hint: "pass --fallback colocated to accept that; see both workers' logs for why" },
      );
    }
  } finally {
    Deno.removeSignalListener("SIGINT", onSignal);
    await node.close(); // the shared links to both workers
  }
}
