/**
 * A throwaway cluster on this machine: fresh node identities that trust each other (a prefill
 * worker, a decode worker and a client), and the two workers started as child processes on
 * loopback. Used by `demo`, the end-to-end tests and the handoff benchmark; stopped with
 * `stop()`, which also deletes the identities.
 */
import { parsePeerCard, TrustList, type TrustRole } from "../transport/mod.ts";
import type { PeerAddress } from "./messages.ts";
import { Node, type NodeLinkOverrides } from "./node.ts";
import { glibcTunablesWithHugePages } from "../ffi/huge_pages.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
/** How long a worker may take to load its model and listen. */
export const WORKER_START_TIMEOUT_MS = 60_000;

export interface LocalWorker {
  role: string;
  peer: PeerAddress;
  process: Deno.ChildProcess;
  /** Lines the worker printed on stderr (its log), most recent last, bounded. */
  log: string[];
  stateDir: string;
  /** How its memory is paged, from its ready line (cli/serve.ts; null: not said). */
  hugePages: string | null;
}

export interface LocalCluster {
  dir: string;
  client: Node;
  prefill: LocalWorker;
  decode: LocalWorker;
  /** Stops both workers (SIGTERM, then SIGKILL after a grace period) and deletes the folder. */
  stop(): Promise<void>;
}

export interface LocalClusterOptions {
  /**
   * Extra `serve` arguments for both workers (model, numerics, bounds). Two workers on one
   * host's loopback have no link worth measuring, so the prefill worker's background link
   * measurement is off (`--link-probe-age-ms 0`) unless these arguments set it.
   */
  args?: string[];
  prefillArgs?: string[];
  decodeArgs?: string[];
  /** The client node's link options (a bench that measures the link as a worker sends). */
  clientLink?: NodeLinkOverrides;
}

/**
 * The roles each node of a local cluster is trusted in, by name: exactly what it needs (the
 * client coordinates; each worker acts in its own role). A name not here (and not in `roles`)
 * gets no roles field: it may act in every role.
 */
export const LOCAL_ROLES: Readonly<Record<string, TrustRole[]>> = {
  client: ["coordinator"],
  coordinator: ["coordinator"],
  prefill: ["prefill"],
  decode: ["decode"],
};

/** Creates identities that trust each other, in `dir`, each in its roles (LOCAL_ROLES). */
export async function makeTrustingNodes(
  dir: string,
  names: string[],
  roles: Record<string, TrustRole[]> = {},
  links: Record<string, NodeLinkOverrides> = {},
): Promise<Map<string, Node>> {
  const nodes = new Map<string, Node>();
  for (const name of names) nodes.set(name, await Node.open(`${dir}/${name}`));
  for (const [name, node] of nodes) {
    const trust = await TrustList.load(node.stateDir);
    for (const [other, peer] of nodes) {
      if (other === name) continue;
      await trust.add({
        ...parsePeerCard(JSON.stringify({
          publicKey: peer.identity.publicKeyText,
          certificateSha256: peer.certificate.fingerprint,
        })),
        label: other,
      }, roles[other] ?? LOCAL_ROLES[other]);
    }
    await trust.save();
  }
  // Reload so each node sees its saved trust list.
  for (const name of names) nodes.set(name, await Node.open(`${dir}/${name}`, links[name]));
  return nodes;
}

/** Where a worker listens, and extra environment (fault injection: serve/fault_points.ts). */
export interface StartWorkerOptions {
  /** `host:port`; default `127.0.0.1:0` (any free port). A restarted worker reuses its port. */
  listen?: string;
  env?: Record<string, string>;
}

/**
 * glibc's huge-page tunable for a worker that keeps `--huge-pages on` (the default) on Linux:
 * its weights and buffers then sit in huge pages from their first touch (ffi/huge_pages.ts).
 */
function workerHugePagesEnv(args: string[]): Record<string, string> {
  const i = args.lastIndexOf("--huge-pages");
  if (Deno.build.os !== "linux" || (i >= 0 && args[i + 1] === "off")) return {};
  return { GLIBC_TUNABLES: glibcTunablesWithHugePages() };
}

/** Starts `serve` as a child process and waits for its ready line. */
export async function startWorker(
  role: string,
  stateDir: string,
  args: string[],
  options: StartWorkerOptions = {},
): Promise<LocalWorker> {
  const process = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--unstable-net",
      MAIN,
      "serve",
      "--role",
      role,
      "--listen",
      options.listen ?? "127.0.0.1:0",
      "--state-dir",
      stateDir,
      ...args,
    ],
    stdout: "piped",
    stderr: "piped",
    env: { ...workerHugePagesEnv(args), ...options.env },
  }).spawn();
  const log: string[] = [];
  pumpLines(process.stderr, (line) => {
    log.push(line);
    if (log.length > 200) log.shift();
  });
  const ready = await readReady(process.stdout, WORKER_START_TIMEOUT_MS).catch(async (error) => {
    try {
      process.kill("SIGKILL");
    } catch { /* already gone */ }
    await process.status;
    throw new Error(`${role} worker did not start: ${(error as Error).message}\n${log.join("\n")}`);
  });
  const [host, port] = String(ready.address).split(":");
  return {
    role,
    peer: { nodeId: String(ready.nodeId), host, port: Number(port) },
    process,
    log,
    stateDir,
    hugePages: typeof ready.hugePages === "string" ? ready.hugePages : null,
  };
}

export async function startLocalCluster(options: LocalClusterOptions = {}): Promise<LocalCluster> {
  const dir = await Deno.makeTempDir({ prefix: "skippy-cluster-" });
  const nodes = await makeTrustingNodes(dir, ["prefill", "decode", "client"], {}, {
    client: options.clientLink ?? {},
  });
  // Later flags win: a caller's own --link-probe-age-ms overrides this default.
  const args = ["--link-probe-age-ms", "0", ...(options.args ?? [])];
  const [decode, prefill] = await Promise.all([
    startWorker("decode", `${dir}/decode`, [...args, ...(options.decodeArgs ?? [])]),
    startWorker("prefill", `${dir}/prefill`, [...args, ...(options.prefillArgs ?? [])]),
  ]);
  return {
    dir,
    client: nodes.get("client")!,
    prefill,
    decode,
    stop: async () => {
      await nodes.get("client")!.close(); // its shared links to both workers
      await Promise.all([stopWorker(prefill), stopWorker(decode)]);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

/** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
export async function stopWorker(worker: LocalWorker, graceMs = 3_000): Promise<void> {
  try {
    worker.process.kill("SIGTERM");
  } catch {
    return; // already exited
  }
  const timer = setTimeout(() => {
    try {
      worker.process.kill("SIGKILL");
    } catch { /* exited meanwhile */ }
  }, graceMs);
  await worker.process.status;
  clearTimeout(timer);
}

async function readReady(
  stdout: ReadableStream<Uint8Array>,
  timeoutMs: number,
): Promise<Record<string, unknown>> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ready line within ${timeoutMs} ms`)), timeoutMs);
  });
  const found = new Promise<Record<string, unknown>>((resolve, reject) => {
    let done = false;
    pumpLines(stdout, (line) => {
      if (done || !line.startsWith("{")) return;
      const json = JSON.parse(line);
      if (json.ready) {
        done = true;
        resolve(json);
      }
    }).then(() => {
      if (!done) reject(new Error("the worker exited before it was ready"));
    });
  });
  try {
    return await Promise.race([found, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Calls `onLine` for each line of `stream` until it ends. */
async function pumpLines(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  let rest = "";
  try {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      rest += chunk;
      let nl: number;
      while ((nl = rest.indexOf("\n")) >= 0) {
        onLine(rest.slice(0, nl));
        rest = rest.slice(nl + 1);
      }
    }
  } catch {
    // The process went away.
  }
  if (rest) onLine(rest);
}
