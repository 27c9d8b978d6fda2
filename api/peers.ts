/**
 * The coordinator's workers, from a peers file, re-read when it changes (its mtime is polled
 * every `peersPollMs`; a file that no longer parses keeps the last good list and says why).
 *
 * The file is JSON: `{"workers": [{"address": "host:port", "nodeId": "...", "role":
 * "prefill" | "decode" | "prefill+decode"}]}` (a bare list is accepted too). Each worker's
 * certificate pin comes from the coordinator's trust list, as for `handoff`.
 *
 * `pick()` takes the decode worker and the prefill worker with the fewest requests this
 * coordinator has running on them (ties: file order).
 */
import { z } from "zod";
import { roleCovers, ROLES } from "../transport/mod.ts";
import type { PeerAddress } from "../serve/messages.ts";
import { parseHostPort } from "../serve/node.ts";

/** Bounds on the peers file: its size and the workers it may list. */
export const PEERS_FILE_BYTES_MAX = 1 << 20;
export const WORKERS_MAX = 256;
export const DEFAULT_PEERS_POLL_MS = 2_000;

export interface WorkerEntry {
  peer: PeerAddress;
  role: (typeof ROLES)[number];
}

const entry = z.object({
  address: z.string().min(3).max(300),
  nodeId: z.string().min(1).max(128),
  role: z.enum(ROLES),
});
const file = z.object({ workers: z.array(entry).min(1).max(WORKERS_MAX) });

/** Parses a peers file's text; throws an Error naming the bad field. */
export function parsePeers(text: string, source = "peers file"): WorkerEntry[] {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new Error(`Cannot read ${source}: not JSON (${(error as Error).message})`);
  }
  const parsed = file.safeParse(Array.isArray(json) ? { workers: json } : json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const where = issue.path.length ? `field "${issue.path.join(".")}"` : "the top level";
    throw new Error(`Cannot read ${source}: ${where}: ${issue.message}`);
  }
  return parsed.data.workers.map((w, i) => {
    const hp = parseHostPort(w.address);
    if (!hp) throw new Error(`Cannot read ${source}: workers.${i}.address is not host:port`);
    return { peer: { nodeId: w.nodeId, host: hp.host, port: hp.port }, role: w.role };
  });
}

/** The workers and how many of this coordinator's requests each one is running. */
export class PeerSet {
  #workers: WorkerEntry[];
  #load = new Map<string, number>();

  constructor(workers: WorkerEntry[]) {
    this.#workers = workers;
  }

  get workers(): readonly WorkerEntry[] {
    return this.#workers;
  }

  replace(workers: WorkerEntry[]): void {
    this.#workers = workers;
  }

  /** The least-loaded decode worker, and prefill worker (null when there is none). */
  pick(): { decode: WorkerEntry; prefill: WorkerEntry | null } | null {
    const least = (role: "prefill" | "decode", not?: WorkerEntry) => {
      let best: WorkerEntry | null = null;
      for (const w of this.#workers) {
        if (!roleCovers(w.role, role) || w === not) continue;
        if (!best || this.loadOf(w) < this.loadOf(best)) best = w;
      }
      return best;
    };
    const decode = least("decode");
    if (!decode) return null;
    return { decode, prefill: least("prefill", decode) };
  }

  loadOf(w: WorkerEntry): number {
    return this.#load.get(w.peer.nodeId) ?? 0;
  }

  /** Counts a request on these workers until the returned function is called. */
  hold(workers: (WorkerEntry | null)[]): () => void {
    const ids = workers.filter((w) => w !== null).map((w) => w!.peer.nodeId);
    for (const id of ids) this.#load.set(id, (this.#load.get(id) ?? 0) + 1);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      for (const id of ids) this.#load.set(id, (this.#load.get(id) ?? 1) - 1);
    };
  }
}

/** Watches a peers file: re-reads it when its mtime changes; `stop()` ends the poll. */
export async function watchPeers(
  path: string,
  set: PeerSet | null,
  options: { pollMs?: number; log?: (line: string) => void } = {},
): Promise<{ set: PeerSet; stop: () => void }> {
  const log = options.log ?? ((line: string) => console.error(line));
  const read = async () => {
    const stat = await Deno.stat(path);
    if (stat.size > PEERS_FILE_BYTES_MAX) {
      throw new Error(`Cannot read peers file "${path}": over ${PEERS_FILE_BYTES_MAX} bytes`);
    }
    return { workers: parsePeers(await Deno.readTextFile(path), `peers file "${path}"`), stat };
  };
  const first = await read();
  const peers = set ?? new PeerSet(first.workers);
  peers.replace(first.workers);
  let mtime = first.stat.mtime?.getTime() ?? 0;
  const timer = setInterval(async () => {
    try {
      const stat = await Deno.stat(path);
      if ((stat.mtime?.getTime() ?? 0) === mtime) return;
      mtime = stat.mtime?.getTime() ?? 0;
      const next = await read();
      peers.replace(next.workers);
      log(`coordinate: peers file re-read: ${next.workers.length} workers`);
    } catch (error) {
      log(`coordinate: keeping the last peers list: ${(error as Error).message}`);
    }
  }, options.pollMs ?? DEFAULT_PEERS_POLL_MS);
  return { set: peers, stop: () => clearInterval(timer) };
}
