/**
 * `serve` started the ways an operator starts it (the npm `bin` wrapper, `deno task cli`)
 * stops on SIGTERM: the Deno process under the launcher is gone and the UDP port is free.
 */
import { assert, assertEquals } from "../testing/assert.ts";
import { testModel } from "../testing/models.ts";

const ROOT = new URL("..", import.meta.url).pathname;

/** Child pids of `pid` (Linux /proc). */
async function childrenOf(pid: number): Promise<number[]> {
  const out: number[] = [];
  for await (const task of Deno.readDir(`/proc/${pid}/task`)) {
    const text = await Deno.readTextFile(`/proc/${pid}/task/${task.name}/children`);
    out.push(...text.trim().split(/\s+/).filter(Boolean).map(Number));
  }
  return out;
}

async function readReadyLine(stream: ReadableStream<Uint8Array>): Promise<Record<string, unknown>> {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`serve ended before its ready line: ${text}`);
    text += value;
    const line = text.split("\n").find((l) => l.startsWith("{"));
    if (line && text.includes("\n")) {
      reader.releaseLock();
      return JSON.parse(line);
    }
  }
}

const LAUNCHERS: { name: string; command: string; args: string[] }[] = [
  { name: "the bin wrapper (node)", command: "node", args: ["bin/skippy-disagg.mjs"] },
  { name: "deno task cli", command: Deno.execPath(), args: ["task", "-q", "cli"] },
];

for (const launcher of LAUNCHERS) {
  Deno.test({
    name: `serve started through ${launcher.name} stops on SIGTERM and frees its port`,
    sanitizeResources: false,
    async fn() {
      const model = await testModel("dense");
      const stateDir = await Deno.makeTempDir({ prefix: "skippy-signal-" });
      const child = new Deno.Command(launcher.command, {
        args: [
          ...launcher.args,
          "serve",
          "--role",
          "decode",
          "--listen",
          "127.0.0.1:0",
          "--state-dir",
          stateDir,
          "--model",
          model,
        ],
        cwd: ROOT,
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const stderr = new Response(child.stderr).text();
      try {
        const ready = await readReadyLine(child.stdout);
        const port = Number(String(ready.address).split(":")[1]);
        assert(port > 0, "the ready line names the port");
        const underLauncher = await childrenOf(child.pid);
        assert(underLauncher.length > 0, "the launcher runs serve as a child process");
        child.kill("SIGTERM");
        const status = await child.status;
        // Checked before reading stderr: an orphaned child would keep stderr open forever.
        for (const pid of underLauncher) {
          const alive = await Deno.stat(`/proc/${pid}`).then(() => true, () => false);
          if (alive) Deno.kill(pid, "SIGKILL"); // this test started it: do not leave it running
          assert(!alive, `process ${pid} under the launcher was still running`);
        }
        assertEquals(status.code, 0, `exit status (stderr: ${await stderr})`);
        assert((await stderr).includes("serve: stopping (SIGTERM)"), "serve saw the signal");
        const socket = Deno.listenDatagram({ hostname: "127.0.0.1", port, transport: "udp" });
        socket.close(); // the port is free again
      } finally {
        try {
          child.kill("SIGKILL");
        } catch { /* already gone */ }
        await child.status;
        await child.stdout.cancel().catch(() => {});
        await Deno.remove(stateDir, { recursive: true });
      }
    },
  });
}
