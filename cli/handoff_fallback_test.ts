import assert from "node:assert/strict";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { handoffArgs, runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

const PROMPT = "the quick brown fox jumps over the lazy dog and ".repeat(20);

Deno.test("handoff says a fallback to colocated, and --fallback chooses if it fails", async () => {
  const model = await testModel("hybrid");
  // A decode worker with other numerics (thread count) is never handed state: colocated.
  const cluster = await startLocalCluster({
    args: ["--model", model],
    decodeArgs: ["--threads", "1"],
  });
  const handoffCli = (...extra: string[]) =>
    runCliProcess([
      ...handoffArgs(cluster),
      "--prompt",
      PROMPT,
      "-n",
      "6",
      ...extra,
    ]);
  try {
    // Default (error): the answer is printed, the fallback is said, and the exit is non-zero.
    const strict = await handoffCli("--json");
    assert.equal(strict.code, 1, strict.stderr);
    const j = JSON.parse(strict.stdout);
    assert.equal(j.placement, "colocated");
    assert.match(j.fallbackReason, /not eligible/);
    assert.equal(j.tokens.length, 6);
    const lines = strict.stderr.split("\n").filter((l) => /fell back to colocated/.test(l));
    assert.equal(lines.length, 1, strict.stderr);
    assert.match(lines[0], /not eligible/);
    assert.match(strict.stderr, /^error: The handoff did not happen/m);
    // Accepted: the same line on stderr, exit 0, the text on stdout.
    const lenient = await handoffCli("--fallback", "colocated");
    assert.equal(lenient.code, 0, lenient.stderr);
    assert.match(lenient.stderr, /handoff: fell back to colocated generation: .*not eligible/);
    assert.equal(lenient.stdout.trimEnd(), j.text.trimEnd());
    const bad = await handoffCli("--fallback", "sometimes");
    assert.equal(bad.code, 2);
  } finally {
    await cluster.stop();
  }
});
