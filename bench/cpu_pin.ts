/**
 * Pins a process (every thread it has now, and so every thread those create) to one CPU, for
 * benchmarks that stand two machines in for two worker processes on one host: each worker gets
 * a core of its own instead of both sharing two under the scheduler. Uses `taskset -a -p -c`
 * (util-linux); where it is missing or the CPU does not exist it refuses, saying why.
 */

/** Pins process `pid` to CPU `cpu` (0-based). */
export async function pinToCpu(pid: number, cpu: number): Promise<string> {
  const cpus = navigator.hardwareConcurrency;
  if (!(Number.isInteger(cpu) && cpu >= 0 && cpu < cpus)) {
    throw new RangeError(`CPU ${cpu} does not exist here: use 0 to ${cpus - 1}`);
  }
  const out = await new Deno.Command("taskset", {
    args: ["-a", "-p", "-c", String(cpu), String(pid)],
    stdout: "null",
    stderr: "piped",
  }).output().catch((error: Error) => {
    throw new Error(
      `Cannot pin process ${pid} to CPU ${cpu}: taskset failed to start (${error.message})`,
    );
  });
  if (!out.success) {
    throw new Error(
      `Cannot pin process ${pid} to CPU ${cpu}: ${new TextDecoder().decode(out.stderr).trim()}`,
    );
  }
  return `process ${pid} on CPU ${cpu}`;
}
