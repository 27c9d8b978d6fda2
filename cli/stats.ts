/** `stats <peer>`: a worker's counters (handoffs, retained and staged bytes, sessions). */
import type { Command } from "commander";
import type { PeerAddress } from "../serve/messages.ts";
import { Node } from "../serve/node.ts";
import { queryStats } from "../serve/stats.ts";
import { intArg } from "./_options.ts";
import { peerArg } from "./_peers.ts";

interface StatsFlags {
  stateDir?: string;
  timeoutMs: number;
  json: boolean;
}

export function register(program: Command): void {
  program
    .command("stats")
    .description("show a worker's counters: handoffs, retained and staged bytes, sessions")
    .argument("<peer>", "worker, <node-id>@<host>:<port>", peerArg)
    .option("--state-dir <dir>", "this client's node identity and trust list (default: per-user)")
    .option("--timeout-ms <ms>", "wait at most this long for the answer", intArg(1, 600_000), 5_000)
    .option("--json", "print one JSON object", false)
    .action(async (peer: PeerAddress, flags: StatsFlags) => {
      const node = await Node.open(flags.stateDir);
      const connection = await node.connect(peer);
      try {
        const counters = await queryStats(connection, flags.timeoutMs);
        if (flags.json) console.log(JSON.stringify(counters));
        else for (const [k, v] of Object.entries(counters)) console.log(`${k.padEnd(20)} ${v}`);
      } finally {
        await connection.close();
      }
    });
}
