import assert from "node:assert/strict";
import { computeApart, pinToCpu, ThreadPinner, threadsOf, unpinProcess } from "./cpu_pin.ts";

Deno.test("pinToCpu refuses a CPU this machine does not have before running taskset", async () => {
  const cpus = navigator.hardwareConcurrency;
  for (const cpu of [-1, cpus, 1.5, Number.NaN]) {
    await assert.rejects(() => pinToCpu(Deno.pid, cpu), /does not exist here: use 0 to/);
  }
});

Deno.test("computeApart puts blocking-pool threads on one CPU and the rest on the other", () => {
  const rule = computeApart(0, 1);
  assert.equal(rule("tokio-runtime-w"), 0);
  assert.equal(rule("deno"), 1);
  assert.equal(rule("V8 DefaultWorke"), 1);
});

/**
 * A `cat` that has echoed a line back: it is past its exec, so its thread carries its own name
 * (a just-spawned child may still carry the spawning runtime's thread name for a moment).
 */
async function runningCat(): Promise<Deno.ChildProcess> {
  const child = new Deno.Command("cat", { stdin: "piped", stdout: "piped" }).spawn();
  const writer = child.stdin.getWriter();
  await writer.write(new TextEncoder().encode("ready\n"));
  writer.releaseLock();
  const reader = child.stdout.getReader();
  await reader.read();
  reader.releaseLock();
  return child;
}

async function stop(child: Deno.ChildProcess): Promise<void> {
  await child.stdin.close();
  await child.stdout.cancel();
  await child.status;
}

Deno.test("threadsOf names a live process's threads and none of one that has exited", async () => {
  const child = await runningCat();
  try {
    const threads = threadsOf(child.pid);
    assert.deepEqual(threads, [{ tid: child.pid, name: "cat" }]);
  } finally {
    await stop(child);
  }
  assert.deepEqual(threadsOf(child.pid), []);
});

const hasTaskset = (() => {
  try {
    return new Deno.Command("taskset", { args: ["-V"] }).outputSync().success;
  } catch {
    return false;
  }
})();

Deno.test({
  name: "ThreadPinner pins each thread by its name and counts what it pinned",
  ignore: !hasTaskset,
  fn: async () => {
    const child = await runningCat();
    try {
      const pinner = await ThreadPinner.start(child.pid, (name) => name === "cat" ? 0 : 1);
      try {
        const status = Deno.readTextFileSync(`/proc/${child.pid}/status`);
        assert.match(status, /^Cpus_allowed_list:\s+0$/m);
        assert.deepEqual(pinner.counts(), { 0: 1 });
        assert.equal(pinner.lastError, null);
      } finally {
        pinner.stop();
      }
    } finally {
      await stop(child);
    }
  },
});

Deno.test({
  name: "unpinProcess gives a pinned process every online CPU again",
  ignore: !hasTaskset || navigator.hardwareConcurrency < 2,
  fn: async () => {
    const child = await runningCat();
    const allowed = () =>
      Deno.readTextFileSync(`/proc/${child.pid}/status`).match(/Cpus_allowed_list:\s*(\S+)/)![1];
    try {
      await pinToCpu(child.pid, 1);
      assert.equal(allowed(), "1");
      await unpinProcess(child.pid);
      assert.equal(allowed(), Deno.readTextFileSync("/sys/devices/system/cpu/online").trim());
    } finally {
      await stop(child);
    }
  },
});
