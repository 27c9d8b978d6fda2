import assert from "node:assert/strict";
import { hugePagesUnavailable } from "../ffi/huge_pages.ts";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

Deno.test("stats prints an idle worker's counters, all held counts zero", async () => {
  const cluster = await startLocalCluster({ args: ["--model", await testModel("dense")] });
  try {
    const { nodeId, host, port } = cluster.decode.peer;
    const r = await runCliProcess([
      "stats",
      `${nodeId}@${host}:${port}`,
      "--state-dir",
      cluster.client.stateDir,
      "--json",
    ]);
    assert.equal(r.code, 0, r.stderr);
    const counters = JSON.parse(r.stdout);
    for (const held of ["decodeAttempts", "stagedBytes", "committedSessions", "contextsBusy"]) {
      assert.equal(counters[held], 0, held);
    }
    // Each worker's ready line says how its memory is paged; where the kernel has huge pages,
    // both have them, whether or not glibc took the tunable (ffi/huge_pages.ts).
    for (const w of [cluster.prefill, cluster.decode]) {
      assert.ok(["malloc", "advised", "none"].includes(w.hugePages ?? ""), `${w.hugePages}`);
      if (hugePagesUnavailable() === null) assert.notEqual(w.hugePages, "none", w.role);
    }
    const bad = await runCliProcess(["stats", "not-a-peer"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /<node-id>@<host>:<port>/);
  } finally {
    await cluster.stop();
  }
});
