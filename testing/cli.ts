/** Runs the CLI as a user would (a child process) and captures its output. */

const MAIN = new URL("../main.ts", import.meta.url).pathname;

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

export async function runCliProcess(
  args: string[],
  env: Record<string, string> = {},
): Promise<CliResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--unstable-net", MAIN, ...args],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** Where a worker listens, as `handoff` takes it: `<node-id>@<host>:<port>`. */
export function peerArg(p: { nodeId: string; host: string; port: number }): string {
  return `${p.nodeId}@${p.host}:${p.port}`;
}

/**
 * The start of a `handoff` command against a local cluster's two workers, as its client
 * identity (serve/local_cluster.ts); a test adds the prompt, `-n` and its own flags.
 */
export function handoffArgs(cluster: {
  prefill: { peer: { nodeId: string; host: string; port: number } };
  decode: { peer: { nodeId: string; host: string; port: number } };
  client: { stateDir: string };
}): string[] {
  return [
    "handoff",
    "--prefill",
    peerArg(cluster.prefill.peer),
    "--decode",
    peerArg(cluster.decode.peer),
    "--state-dir",
    cluster.client.stateDir,
  ];
}
