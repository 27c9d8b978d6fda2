/**
 * A CPU quota on one process, for benchmarks that need one node slower than another on one
 * machine: llama.cpp's thread count is part of the numerical identity, so a slower decode
 * worker with the same numerics is made by throttling its process (a cgroup's CFS quota), not
 * by giving it fewer threads. Needs root and the cgroup v1 `cpu` controller or cgroup v2's
 * `cpu.max`; without them it refuses, saying why.
 */

const V1 = "/sys/fs/cgroup/cpu";
const V2 = "/sys/fs/cgroup";
/**
 * The CFS period: a throttled process runs for `fraction` of each period and then waits for the
 * next. 10 ms keeps that wait short (with the default 100 ms a third of a core meant 67 ms
 * stalls, which delayed the decoder's ping replies enough for its link to look degraded).
 */
const PERIOD_US = 10_000;

export interface CpuQuota {
  /** Where the limit lives, e.g. `cgroup v1 /sys/fs/cgroup/cpu/skippy-bench-123: 33% of a core`. */
  describe: string;
  /** Moves the process back to the parent group (if it still runs) and removes the group. */
  release(): Promise<void>;
}

/** Limits process `pid` (every thread, present and future) to `fraction` of one core. */
export async function limitCpu(pid: number, fraction: number): Promise<CpuQuota> {
  if (!(fraction > 0 && fraction <= 1)) {
    throw new RangeError(
      `CPU quota ${fraction} is out of range: use a fraction of a core in (0, 1]`,
    );
  }
  const quotaUs = Math.max(1000, Math.round(PERIOD_US * fraction));
  const name = `skippy-bench-${Deno.pid}-${pid}`;
  const v1 = await Deno.stat(`${V1}/cpu.cfs_quota_us`).then(() => true, () => false);
  const v2 = !v1 && await Deno.stat(`${V2}/cgroup.controllers`).then(() => true, () => false);
  if (!v1 && !v2) {
    throw new Error(
      "Cannot limit the decode worker's CPU: neither the cgroup v1 cpu controller nor cgroup v2 " +
        "is mounted under /sys/fs/cgroup",
    );
  }
  const root = v1 ? V1 : V2;
  const dir = `${root}/${name}`;
  try {
    await Deno.mkdir(dir);
    if (v1) {
      await Deno.writeTextFile(`${dir}/cpu.cfs_period_us`, String(PERIOD_US));
      await Deno.writeTextFile(`${dir}/cpu.cfs_quota_us`, String(quotaUs));
    } else {
      await Deno.writeTextFile(`${dir}/cpu.max`, `${quotaUs} ${PERIOD_US}`);
    }
    await Deno.writeTextFile(`${dir}/cgroup.procs`, String(pid));
  } catch (error) {
    await Deno.remove(dir).catch(() => {});
    throw new Error(
      `Cannot limit the decode worker's CPU in ${dir}: ${(error as Error).message} ` +
        "(run as root, with the cpu controller enabled)",
    );
  }
  return {
    describe: `cgroup ${v1 ? "v1" : "v2"} ${dir}: ${Math.round(fraction * 100)}% of a core`,
    release: async () => {
      await Deno.writeTextFile(`${root}/cgroup.procs`, String(pid)).catch(() => {});
      await Deno.remove(dir).catch(() => {});
    },
  };
}
