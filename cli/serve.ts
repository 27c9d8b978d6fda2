/**
 * `serve --role prefill|decode|prefill+decode --listen <host:port> --model <gguf>`: runs a
 * worker until interrupted. Prints one `ready` line (with the node id and address) once it
 * accepts connections, then one line per handoff; never prompt content.
 */
import { MALLOC_HUGE_PAGES_TUNABLE, mallocHugePagesAsked, memoryPaging } from "../ffi/mod.ts";
import { type Command, Option } from "commander";
import { DEFAULT_HANDOFF_TIMING } from "../core/handoff.ts";
import { hostUdpBufferAdvice, type Role, ROLES } from "../transport/mod.ts";
import { Worker, type WorkerOptions } from "../serve/worker.ts";
import type { RuntimeConfig } from "../serve/engine.ts";
import { DEFAULT_PREFILL_QUEUE } from "../serve/prefill_queue.ts";
import { DEFAULT_PREFIX_CACHE } from "../serve/prefix_cache.ts";
import { CHUNK_BYTES_MIN, DEFAULT_EXPORT_LIMITS } from "../serve/exporter.ts";
import { CONGESTION_CONTROL_MODES, type CongestionControlMode } from "../core/mod.ts";
import { DEFAULT_BBR_LOSS_FRACTION_MIN } from "../serve/congestion_choice.ts";
import {
  addRuntimeOptions,
  intArg,
  numberArg,
  runtimeConfigFrom,
  type RuntimeFlags,
} from "./_options.ts";
import {
  addSpeculationOptions,
  speculationConfigFrom,
  type SpeculationFlags,
} from "./_speculation.ts";
import { listenArg } from "./_peers.ts";
import { numericsOf } from "./_report.ts";
import { stopSignal } from "./stop_signal.ts";

interface ServeFlags extends RuntimeFlags, SpeculationFlags {
  role: Role;
  listen: { host: string; port: number };
  stateDir?: string;
  sessionsMax: number;
  leaseMs: number;
  commitTimeoutMs: number;
  reserveTimeoutMs: number;
  reservationMs: number;
  maxIdleTimeoutMs: number;
  inflightBytesMax: number;
  congestionControl: CongestionControlMode;
  bbrLossFractionMin: number;
  committedIdleMs: number;
  layerCapture: "on" | "off";
  lastPageCapture: "on" | "off";
  stateChunkBytes: number;
  prefillQueueDepthMax: number;
  prefillQueueWaitMs: number;
  prefixCacheBytesMax: number;
  linkProbeAgeMs: number;
  prefixBlockTokens: number;
  prefixCheckpointsMax: number;
  batching?: "on" | "off";
  stepTokensMax: number;
  queueDepthMax: number;
  queueWaitMs: number;
}

export function register(program: Command): void {
  const cmd = program
    .command("serve")
    .description("run a prefill and/or decode worker")
    .addOption(new Option("--role <role>", "worker role").choices([...ROLES]).makeOptionMandatory())
    .requiredOption(
      "--listen <host:port>",
      "address to listen on (port 0: any free port)",
      listenArg,
    )
    .option("--state-dir <dir>", "node identity, certificate and trust list (default: per-user)");
  addSessionOptions(cmd);
  addHandoffOptions(cmd);
  addPrefillExportOptions(cmd);
  addPrefillQueueAndCacheOptions(cmd);
  addSpeculationOptions(addRuntimeOptions(cmd)).action((flags: ServeFlags) => runServe(flags));
}

/** Sessions served at once, decode batching, and the decode side's wait queue. */
function addSessionOptions(cmd: Command): Command {
  return cmd
    .option(
      "--sessions-max <n>",
      "requests served at once (decode with batching: sequences of one shared context; else one context each)",
      intArg(1, 64),
      2,
    )
    .addOption(
      new Option(
        "--batching <on|off>",
        "decode: continuous batching of all sessions in one context (off: a context per " +
          "session; default: on where it can be used, else off with the reason logged)",
      ).choices(["on", "off"]),
    )
    .option(
      "--step-tokens-max <n>",
      "decode with batching: most tokens per step (one per stream, the rest prompt chunks)",
      intArg(1, 8192),
      512,
    )
    .option(
      "--queue-depth-max <n>",
      "decode: requests that may wait for a free session (beyond: refused busy)",
      intArg(0, 65_536),
      64,
    )
    .option(
      "--queue-wait-ms <ms>",
      "decode: how long a request waits for a free session before it is refused busy",
      intArg(0, 3_600_000),
      1_000,
    );
}

/** The handoff's timing (lease, timeouts, reservation) and the link's limits. */
function addHandoffOptions(cmd: Command): Command {
  return cmd
    .option(
      "--lease-ms <ms>",
      "how long prefill state is retained awaiting CommitAck",
      intArg(1, 3_600_000),
      30_000,
    )
    .option(
      "--commit-timeout-ms <ms>",
      "how long to wait for CommitAck",
      intArg(1, 3_600_000),
      10_000,
    )
    .option(
      "--reserve-timeout-ms <ms>",
      "how long to wait for a reservation",
      intArg(1, 600_000),
      2_000,
    )
    .option(
      "--reservation-ms <ms>",
      "how long a decode reservation may wait for its next state chunk (renewed by each)",
      intArg(1, 86_400_000),
      DEFAULT_HANDOFF_TIMING.reservationMs,
    )
    .option(
      "--max-idle-timeout-ms <ms>",
      "a silent peer is declared dead after this",
      intArg(100, 600_000),
      2_000,
    )
    .option(
      "--inflight-bytes-max <bytes>",
      "handoff stream credit window",
      intArg(1 << 16, 2 ** 31),
      64 << 20,
    )
    .addOption(
      new Option(
        "--congestion-control <auto|cubic|bbr>",
        "the controller this node sends with: cubic (best on clean fast links), bbr (holds its " +
          "rate under random loss), or auto: a prefill worker's link to a decode worker goes " +
          "bbr once its loss probe finds loss (--bbr-loss-fraction-min), cubic otherwise",
      ).choices(CONGESTION_CONTROL_MODES).default("auto"),
    )
    .option(
      "--bbr-loss-fraction-min <p>",
      "auto: the loss (loss events over a probe's datagrams) from which a link goes bbr",
      numberArg(0, 1),
      DEFAULT_BBR_LOSS_FRACTION_MIN,
    )
    .option(
      "--committed-idle-ms <ms>",
      "a committed session waits this long for its generate request",
      intArg(1, 3_600_000),
      30_000,
    );
}

/** How a prefill worker sends the state: layer capture, last-page capture, chunk size. */
function addPrefillExportOptions(cmd: Command): Command {
  return cmd
    .addOption(
      new Option(
        "--layer-capture <on|off>",
        "prefill: send each recurrent layer's final state while the last chunk still computes",
      ).choices(["on", "off"]).default("on"),
    )
    .addOption(
      new Option(
        "--last-page-capture <on|off>",
        "prefill, with --layer-capture on: send a hybrid model's last KV page as soon as its last attention layer has written it",
      ).choices(["on", "off"]).default("on"),
    )
    .option(
      "--state-chunk-bytes <n>",
      "prefill: largest state chunk sent; larger components go as token pages or byte pieces",
      intArg(CHUNK_BYTES_MIN, DEFAULT_EXPORT_LIMITS.chunkBytesMax),
      DEFAULT_EXPORT_LIMITS.chunkBytesMax,
    );
}

/**
 * The prefill worker's queue and exact-prefix cache. `--link-probe-age-ms` sits among the
 * cache's options because --help has always listed it there.
 */
function addPrefillQueueAndCacheOptions(cmd: Command): Command {
  return cmd
    .option(
      "--prefill-queue-depth-max <n>",
      "prefill: requests that may wait for a context; one more is answered busy (colocated)",
      intArg(0, 4096),
      DEFAULT_PREFILL_QUEUE.prefillQueueDepthMax,
    )
    .option(
      "--prefill-queue-wait-ms <ms>",
      "prefill: longest a request waits for a context before it is answered busy (colocated)",
      intArg(1, 3_600_000),
      DEFAULT_PREFILL_QUEUE.prefillQueueWaitMs,
    )
    .option(
      "--prefix-cache-bytes-max <bytes>",
      "prefill: bytes of exact-prefix checkpoints kept per worker, LRU (0: off, the default; " +
        "one hybrid checkpoint costs its tokens' KV plus a whole recurrent snapshot)",
      intArg(0, Number.MAX_SAFE_INTEGER),
      DEFAULT_PREFIX_CACHE.prefixCacheBytesMax,
    )
    .option(
      "--link-probe-age-ms <ms>",
      "prefill: after a committed handoff, measure the link to that decode worker (pings, an " +
        "8 MiB probe, then up to 10,000 datagrams for its loss, in the background) when its " +
        "last loss probe is older than this; the coordinator's placement reads the loss (0: never)",
      intArg(0, 86_400_000),
      20_000,
    )
    .option(
      "--prefix-block-tokens <n>",
      "prefill: prefix cache block: checkpoints and hits sit at multiples of this many tokens",
      intArg(1, 65_536),
      DEFAULT_PREFIX_CACHE.prefixBlockTokens,
    )
    .option(
      "--prefix-checkpoints-max <n>",
      "prefill: checkpoints taken per request (block boundaries spread evenly up to the prompt end)",
      intArg(1, 64),
      DEFAULT_PREFIX_CACHE.prefixCheckpointsMax,
    );
}

async function runServe(flags: ServeFlags): Promise<void> {
  // Speculation is the decode role's (per-session contexts). A prefill+decode worker shares
  // its contexts with prefill, whose layer capture needs contexts without rollback snapshots,
  // so it does not speculate; it says so.
  const speculation = flags.role === "decode" ? speculationConfigFrom(flags) : undefined;
  if (flags.role !== "decode" && flags.speculation !== "none") {
    console.error(`speculation ${flags.speculation}: ignored: only --role decode speculates`);
  }
  const runtime = { ...await runtimeConfigFrom(flags), speculation };
  const worker = await Worker.start(workerOptionsFrom(flags, runtime));
  await adviseOnStart(runtime);
  // The first SIGINT/SIGTERM stops cleanly: the listener and its endpoint close (freeing the
  // port), peers get a graceful close (bounded by closeTimeoutMs), and in-flight handoffs are
  // aborted, so each prefiller sees the abort and falls back. A second signal exits at once.
  // Installed before the ready line, so a signal sent on seeing it is never the default kill.
  const stop = stopSignal();
  const { hostname, port } = worker.addr;
  console.log(JSON.stringify({
    ready: true,
    role: flags.role,
    nodeId: worker.node.identity.nodeId,
    address: `${hostname}:${port}`,
    peer: `${worker.node.identity.nodeId}@${hostname}:${port}`,
    numerics: numericsOf(runtime, worker.pool.model.lib),
    hugePages: memoryPaging(runtime.hugePages !== false, worker.pool.model.weightsInHugePages),
  }));
  console.error(`serve: stopping (${await stop})`);
  await worker.close();
}

/** The worker the flags describe, on `runtime` (speculation already decided by role). */
function workerOptionsFrom(flags: ServeFlags, runtime: RuntimeConfig): WorkerOptions {
  return {
    role: flags.role,
    hostname: flags.listen.host,
    port: flags.listen.port,
    runtime,
    stateDir: flags.stateDir,
    sessionsMax: flags.sessionsMax,
    batching: flags.batching,
    stepTokensMax: flags.stepTokensMax,
    admission: { queueDepthMax: flags.queueDepthMax, queueWaitMs: flags.queueWaitMs },
    timing: {
      leaseMs: flags.leaseMs,
      commitTimeoutMs: flags.commitTimeoutMs,
      reserveTimeoutMs: flags.reserveTimeoutMs,
      reservationMs: flags.reservationMs,
    },
    link: {
      maxIdleTimeoutMs: flags.maxIdleTimeoutMs,
      inflightBytesMax: flags.inflightBytesMax,
      congestionControl: flags.congestionControl,
      bbrLossFractionMin: flags.bbrLossFractionMin,
    },
    committedIdleMs: flags.committedIdleMs,
    prefillLimits: {
      layerCapture: flags.layerCapture === "on",
      lastPageCapture: flags.lastPageCapture === "on",
      chunkBytesMax: flags.stateChunkBytes,
    },
    prefillQueue: {
      prefillQueueDepthMax: flags.prefillQueueDepthMax,
      prefillQueueWaitMs: flags.prefillQueueWaitMs,
    },
    linkProbeAgeMs: flags.linkProbeAgeMs,
    prefixCache: {
      prefixCacheBytesMax: flags.prefixCacheBytesMax,
      prefixBlockTokens: flags.prefixBlockTokens,
      prefixCheckpointsMax: flags.prefixCheckpointsMax,
    },
  };
}

/** What the started worker says on stderr about its host and its costs: named, not silent. */
async function adviseOnStart(runtime: RuntimeConfig): Promise<void> {
  if (runtime.hugePages && Deno.build.os === "linux" && !mallocHugePagesAsked()) {
    // Named, not silent: without the tunable only the weights and contexts are advised, after
    // allocation. (With it, a process where glibc did not take it says so itself.)
    console.error(
      "huge pages: the weights and contexts advised after they are allocated; start serve with " +
        `GLIBC_TUNABLES=${MALLOC_HUGE_PAGES_TUNABLE} to have every buffer in huge pages from ` +
        "its first touch (ffi/huge_pages.ts)",
    );
  }
  // Named, not silent: a small UDP receive buffer slows every handoff this worker receives.
  const udpAdvice = await hostUdpBufferAdvice();
  if (udpAdvice) console.error(udpAdvice);
  const speculation = runtime.speculation;
  if (speculation && speculation.mode !== "none") {
    // Named, not silent: what speculation costs the handoff on this worker.
    console.error(
      `speculation ${speculation.mode}: up to ${speculation.draftTokensMax} drafts per step on ` +
        `per-session contexts (greedy and sampled requests); hybrid contexts keep ` +
        `${speculation.draftTokensMax} recurrent snapshots per sequence`,
    );
  }
}
