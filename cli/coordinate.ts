/**
 * `coordinate`: the OpenAI-compatible API in front of the workers (api/).
 *
 *     skippy-disagg coordinate --listen 127.0.0.1:8080 --peers peers.json [--api-keys keys.json]
 *     skippy-disagg coordinate --local [--model m.gguf]
 *
 * `--peers` names the workers (re-read when the file changes); `--local` starts one prefill
 * and one decode worker as child processes on loopback, with fresh identities that trust each
 * other and this coordinator, and stops them on SIGINT/SIGTERM. Prints one ready line (JSON,
 * stdout) with the URL; says on stderr whether the API is authenticated.
 */
import { type Command, Option } from "commander";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { Node } from "../serve/node.ts";
import { DEFAULT_ADMISSION } from "../api/admission.ts";
import { ApiKeys } from "../api/keys.ts";
import { DEFAULT_PEERS_POLL_MS, PeerSet, watchPeers } from "../api/peers.ts";
import { PLACEMENT_MODES, type PlacementMode } from "../api/placement.ts";
import { DEFAULT_LINK_PING_INTERVAL_MS, LivePlacement } from "../api/live_placement.ts";
import { parseCalibration } from "../core/node_rates.ts";
import { _certification } from "./plan.ts";
import { openTelemetrySink } from "../api/telemetry.ts";
import { DEFAULT_PLAN_OPTIONS } from "../core/planner.ts";
import { UsageError } from "../core/errors.ts";
import { defaultModelPath } from "./_default_model.ts";
import { intArg } from "./_options.ts";
import { listenArg } from "./_peers.ts";
import { addSpeculationOptions } from "./_speculation.ts";
import { stopSignal } from "./stop_signal.ts";
import type { SpeculationMode } from "../core/speculation.ts";

interface CoordinateFlags {
  listen: { host: string; port: number };
  peers?: string;
  local: boolean;
  model?: string;
  ctx: number;
  apiKeys?: string;
  placement: PlacementMode;
  telemetry?: string;
  stateDir?: string;
  requestsInFlightMax: number;
  queueDepthMax: number;
  queueWaitMs: number;
  timeoutMs: number;
  peersPollMs: number;
  promptTokensMin: number;
  calibration?: string;
  certification?: string;
  linkPingMs: number;
  speculation: SpeculationMode;
  draftTokens: number;
  mtpDraftTokens: number;
}

export function register(program: Command): void {
  const cmd = program
    .command("coordinate")
    .description("serve the OpenAI-compatible API (completions, chat) in front of the workers")
    .option("--listen <host:port>", "HTTP address", listenArg, { host: "127.0.0.1", port: 8080 })
    .option("--peers <file>", "JSON list of workers: {workers: [{address, nodeId, role}]}")
    .option("--local", "start one prefill and one decode worker on loopback and serve them", false)
    .option("--model <gguf>", "the model the workers serve (default: the tiny hybrid test model)")
    .option(
      "--ctx <tokens>",
      "the workers' context size (serve --ctx)",
      intArg(16, 1 << 20),
      RUNTIME_DEFAULTS.nCtx,
    )
    .option("--api-keys <file>", 'JSON object {"<key>": "<tenant>"}; without it: unauthenticated')
    .addOption(
      new Option("--placement <mode>", "where requests run").choices([...PLACEMENT_MODES]).default(
        "auto",
      ),
    )
    .option("--telemetry <file|->", "append one JSON line per request (no content); - is stdout")
    .option(
      "--state-dir <dir>",
      "with --peers: this node's identity and trust list (default: per-user)",
    );
  addLimitOptions(cmd);
  addAutoPlacementOptions(cmd);
  // With --local, the decode worker's server default (serve --speculation): every API request
  // it decodes speculates (on contexts of its own: batching is off on such a worker, logged).
  addSpeculationOptions(cmd);
  cmd.action((flags: CoordinateFlags) => runCoordinate(flags));
}

/** Bounds on requests (in flight, waiting, wait, progress timeout) and the peers file poll. */
function addLimitOptions(cmd: Command): Command {
  return cmd
    .option(
      "--requests-in-flight-max <n>",
      "requests running at once (match the decode workers' --sessions-max)",
      intArg(1, 4096),
      DEFAULT_ADMISSION.requestsInFlightMax,
    )
    .option(
      "--queue-depth-max <n>",
      "requests waiting for a slot; more get 503",
      intArg(0, 1 << 20),
      DEFAULT_ADMISSION.queueDepthMax,
    )
    .option(
      "--queue-wait-ms <ms>",
      "longest wait for a slot before a 503",
      intArg(1, 3_600_000),
      DEFAULT_ADMISSION.queueWaitMs,
    )
    .option(
      "--timeout-ms <ms>",
      "fail a request when its workers report no progress for this long",
      intArg(1, 86_400_000),
      120_000,
    )
    .option(
      "--peers-poll-ms <ms>",
      "how often the peers file's mtime is checked",
      intArg(100, 3_600_000),
      DEFAULT_PEERS_POLL_MS,
    );
}

/** What `--placement auto` decides with: the prompt floor, rates, certification, link pings. */
function addAutoPlacementOptions(cmd: Command): Command {
  return cmd
    .option(
      "--prompt-tokens-min <n>",
      "auto placement: shorter prompts run colocated (planner's promptTokensMin)",
      intArg(1, 1 << 30),
      DEFAULT_PLAN_OPTIONS.promptTokensMin,
    )
    .option(
      "--calibration <file>",
      "auto placement: worker rates from `bench calibrate` (by node id, or role name prefill/decode); default: learned from completed requests",
    )
    .option(
      "--certification <file>",
      "auto placement: families certified for exact handoffs (default: the one `correctness state-handoff --certify` writes)",
    )
    .option(
      "--link-ping-ms <ms>",
      "auto placement: ping each worker at most this often",
      intArg(100, 3_600_000),
      DEFAULT_LINK_PING_INTERVAL_MS,
    );
}

/** What `runCoordinate` closes on the way out, in order. */
type Cleanups = (() => Promise<void> | void)[];

async function runCoordinate(flags: CoordinateFlags): Promise<void> {
  if (flags.local === (flags.peers !== undefined)) {
    throw new UsageError("Pass exactly one of --peers <file> and --local", {
      hint: "--local starts two workers on this machine; --peers names running ones",
    });
  }
  const model = flags.model ?? await defaultModelPath();
  const keys = flags.apiKeys ? await ApiKeys.load(flags.apiKeys) : null;
  const sink = flags.telemetry ? await openTelemetrySink(flags.telemetry) : null;
  const cleanups: Cleanups = [];
  const log = (line: string) => console.error(line);
  try {
    const { node, peers } = flags.local
      ? await startLocalWorkers(flags, model, log, cleanups)
      : await watchPeerWorkers(flags, log, cleanups);
    const live = flags.placement === "auto" ? await livePlacement(flags, node) : null;
    if (live) {
      cleanups.unshift(() => live.close());
      log(
        `coordinate: auto placement: certification ${live.options.certificationSource}; rates ${
          flags.calibration ? `from ${flags.calibration}` : "learned from completed requests"
        }; the prefill->decode link is estimated from the handoffs' own transfers`,
      );
    }
    // The HTTP face (Hono, zod, prom-client) loads only when a coordinator starts, not with
    // every command.
    const { startApiServer } = await import("../api/server.ts");
    const server = await startApiServer({
      live,
      hostname: flags.listen.host,
      port: flags.listen.port,
      node,
      modelPath: model,
      nCtx: flags.ctx,
      peers,
      placement: flags.placement,
      admission: {
        requestsInFlightMax: flags.requestsInFlightMax,
        queueDepthMax: flags.queueDepthMax,
        queueWaitMs: flags.queueWaitMs,
      },
      keys,
      telemetry: sink?.write ?? null,
      workerIdleTimeoutMs: flags.timeoutMs,
      promptTokensMin: flags.promptTokensMin,
    });
    cleanups.unshift(() => server.close());
    const stop = stopSignal();
    announceReady(flags, server, keys !== null, peers, log);
    log(`coordinate: stopping (${await stop})`);
  } finally {
    for (const cleanup of cleanups) await cleanup();
    sink?.close();
  }
}

/** `--local`: a prefill and a decode worker as child processes, trusting this coordinator. */
async function startLocalWorkers(
  flags: CoordinateFlags,
  model: string,
  log: (line: string) => void,
  cleanups: Cleanups,
): Promise<{ node: Node; peers: PeerSet }> {
  log("coordinate: starting a prefill and a decode worker on 127.0.0.1 (fresh identities)");
  const cluster = await startLocalCluster({
    args: [
      "--model",
      model,
      "--ctx",
      String(flags.ctx),
      "--sessions-max",
      String(Math.min(64, flags.requestsInFlightMax)),
    ],
    decodeArgs: flags.speculation === "none" ? [] : [
      "--speculation",
      flags.speculation,
      "--draft-tokens",
      String(flags.draftTokens),
      "--mtp-draft-tokens",
      String(flags.mtpDraftTokens),
    ],
  });
  cleanups.push(() => cluster.stop());
  const peers = new PeerSet([
    { peer: cluster.prefill.peer, role: "prefill" },
    { peer: cluster.decode.peer, role: "decode" },
  ]);
  return { node: cluster.client, peers };
}

/** `--peers`: this node's identity, and the workers the file names, re-read when it changes. */
async function watchPeerWorkers(
  flags: CoordinateFlags,
  log: (line: string) => void,
  cleanups: Cleanups,
): Promise<{ node: Node; peers: PeerSet }> {
  if (flags.speculation !== "none") {
    log(
      `coordinate: --speculation ${flags.speculation} ignored with --peers: speculation is ` +
        "the decode workers' default (serve --role decode --speculation <mode>)",
    );
  }
  const node = await Node.open(flags.stateDir);
  const watch = await watchPeers(flags.peers!, null, { pollMs: flags.peersPollMs, log });
  cleanups.push(watch.stop);
  return { node, peers: watch.set };
}

/** The startup line on stderr (saying whether the API is authenticated), then the ready line. */
function announceReady(
  flags: CoordinateFlags,
  server: { url: string; model: { id: string } },
  authenticated: boolean,
  peers: PeerSet,
  log: (line: string) => void,
): void {
  const auth = authenticated
    ? "authenticated (--api-keys)"
    : `UNAUTHENTICATED (no --api-keys): every request is tenant "default"` +
      (isLoopback(flags.listen.host) ? "" : "; this address is reachable beyond this machine");
  log(
    `coordinate: serving "${server.model.id}" at ${server.url}/v1, placement ${flags.placement}, ` +
      `${peers.workers.length} workers; ${auth}`,
  );
  console.log(JSON.stringify({
    ready: true,
    url: server.url,
    model: server.model.id,
    authenticated,
    placement: flags.placement,
  }));
}

async function livePlacement(flags: CoordinateFlags, node: Node): Promise<LivePlacement> {
  const cert = await _certification(flags.certification);
  const calibration = flags.calibration
    ? parseCalibration(JSON.parse(await Deno.readTextFile(flags.calibration)), flags.calibration)
    : null;
  return new LivePlacement({
    localNodeId: node.identity.nodeId,
    certification: cert.file,
    certificationSource: cert.path ?? "no certification file",
    calibration,
    pingIntervalMs: flags.linkPingMs,
    chunkTokens: RUNTIME_DEFAULTS.chunkTokens,
    promptTokensMin: flags.promptTokensMin,
  });
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || host.startsWith("127.");
}
