/**
 * Pins processes and threads to CPUs, for benchmarks that stand two machines in for two worker
 * processes on one host. Uses `taskset` (util-linux); where it is missing or the CPU does not
 * exist it refuses, saying why.
 *
 * Two layouts (bench/link_matrix.ts `--pin-workers`):
 *
 * - `on`: each worker process, every thread, on a CPU of its own (prefill 0, decode 1); the
 *   relay floats. The prefiller's network thread then shares the compute's one core, and the
 *   relay (scheduled ahead of ordinary work) lands there too: a 100 Mbit/s transfer stretched
 *   a lab-state prefill by 1.5-4 s (FINDINGS section 000000).
 * - `split`: the prefill worker's compute alone on CPU 0 (its llama.cpp threads: the runtime's
 *   blocking-pool threads, named `tokio-runtime-w...`), and everything that stands in for the
 *   network or the other machine on CPU 1: the prefill worker's other threads (its event loop,
 *   which runs QUIC), the relay (at rates it sustains sharing that CPU; above them it floats),
 *   the decode worker. `ThreadPinner` keeps it so as threads come and go.
 *
 * @module
 */

/** Pins process `pid` (every thread it has now, and so every thread those create) to `cpu`. */
export async function pinToCpu(pid: number, cpu: number): Promise<string> {
  await _taskset(["-a", "-p", "-c", String(_checkCpu(cpu)), String(pid)], `process ${pid}`, cpu);
  return `process ${pid} on CPU ${cpu}`;
}

/**
 * Lets process `pid` (every thread) run on every online CPU again: the host's own list
 * (`/sys/devices/system/cpu/online`), not this process's count, which a pin has narrowed.
 */
export async function unpinProcess(pid: number): Promise<void> {
  const online = Deno.readTextFileSync("/sys/devices/system/cpu/online").trim();
  await _taskset(["-a", "-p", "-c", online, String(pid)], `process ${pid}`, online);
}

/** Runs `work` with this process on `cpu` alone, then on every online CPU (null: as it is). */
export async function withProcessOn<T>(cpu: number | null, work: () => Promise<T>): Promise<T> {
  if (cpu === null) return await work();
  await pinToCpu(Deno.pid, cpu);
  try {
    return await work();
  } finally {
    await unpinProcess(Deno.pid);
  }
}

/** Pins one thread `tid` (not the threads it creates later: they start where it is). */
export async function pinThreadToCpu(tid: number, cpu: number): Promise<void> {
  await _taskset(["-p", "-c", String(_checkCpu(cpu)), String(tid)], `thread ${tid}`, cpu);
}

/** A thread of a process: its id and its name (`/proc/<pid>/task/<tid>/comm`). */
export interface ThreadName {
  tid: number;
  name: string;
}

/** The threads of process `pid` now (empty once it has exited). */
export function threadsOf(pid: number): ThreadName[] {
  const out: ThreadName[] = [];
  try {
    for (const e of Deno.readDirSync(`/proc/${pid}/task`)) {
      try {
        const name = Deno.readTextFileSync(`/proc/${pid}/task/${e.name}/comm`).trim();
        out.push({ tid: Number(e.name), name });
      } catch { /* the thread ended while listed */ }
    }
  } catch { /* the process ended */ }
  return out;
}

/** `split`'s rule for the prefill worker: compute threads on `computeCpu`, others on `otherCpu`. */
export function computeApart(computeCpu: number, otherCpu: number): (name: string) => number {
  return (name) => name.startsWith("tokio-runtime-w") ? computeCpu : otherCpu;
}

/**
 * Keeps every thread of a process on the CPU `cpuFor(its name)` says, pinning each new thread
 * within `pollMs` of its creation (a thread starts on its creator's CPU). Stop it with `stop()`
 * or `using`.
 *
 * @example
 * ```ts
 * using _ = await ThreadPinner.start(prefillPid, computeApart(0, 1));
 * ```
 */
export class ThreadPinner implements Disposable {
  readonly pid: number;
  readonly pollMs: number;
  readonly #cpuFor: (name: string) => number;
  readonly #pinned = new Map<number, number>();
  #timer: ReturnType<typeof setInterval> | undefined;
  #busy = false;
  /** The last failure to pin a thread that still exists (null: none). */
  lastError: string | null = null;

  private constructor(pid: number, cpuFor: (name: string) => number, pollMs: number) {
    this.pid = pid;
    this.#cpuFor = cpuFor;
    this.pollMs = pollMs;
  }

  /** Pins the threads there are now (failing as `pinToCpu` does), then keeps watching. */
  static async start(
    pid: number,
    cpuFor: (name: string) => number,
    pollMs = 100,
  ): Promise<ThreadPinner> {
    if (!(pollMs > 0)) throw new RangeError(`Invalid pollMs ${pollMs}: must be positive`);
    const p = new ThreadPinner(pid, cpuFor, pollMs);
    await p.#pass(true);
    const timer = setInterval(() => void p.#pass(false), pollMs);
    Deno.unrefTimer(timer);
    p.#timer = timer;
    return p;
  }

  /** Threads pinned so far, by CPU: what the run file can record. */
  counts(): Record<number, number> {
    const out: Record<number, number> = {};
    for (const cpu of this.#pinned.values()) out[cpu] = (out[cpu] ?? 0) + 1;
    return out;
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  [Symbol.dispose](): void {
    this.stop();
  }

  async #pass(strict: boolean): Promise<void> {
    if (this.#busy) return;
    this.#busy = true;
    try {
      const live = threadsOf(this.pid);
      const seen = new Set(live.map((t) => t.tid));
      for (const tid of this.#pinned.keys()) if (!seen.has(tid)) this.#pinned.delete(tid);
      for (const t of live) {
        const cpu = this.#cpuFor(t.name);
        if (this.#pinned.get(t.tid) === cpu) continue;
        try {
          await pinThreadToCpu(t.tid, cpu);
          this.#pinned.set(t.tid, cpu);
        } catch (error) {
          // A thread that ended meanwhile is no failure.
          if (!threadsOf(this.pid).some((x) => x.tid === t.tid)) continue;
          if (strict) throw error;
          this.lastError = (error as Error).message;
        }
      }
    } finally {
      this.#busy = false;
    }
  }
}

function _checkCpu(cpu: number): number {
  const cpus = navigator.hardwareConcurrency;
  if (!(Number.isInteger(cpu) && cpu >= 0 && cpu < cpus)) {
    throw new RangeError(`CPU ${cpu} does not exist here: use 0 to ${cpus - 1}`);
  }
  return cpu;
}

async function _taskset(args: string[], what: string, cpu: number | string): Promise<void> {
  const out = await new Deno.Command("taskset", {
    args,
    stdout: "null",
    stderr: "piped",
  }).output().catch((error: Error) => {
    throw new Error(`Cannot pin ${what} to CPU ${cpu}: taskset failed to start (${error.message})`);
  });
  if (!out.success) {
    throw new Error(
      `Cannot pin ${what} to CPU ${cpu}: ${new TextDecoder().decode(out.stderr).trim()}`,
    );
  }
}
