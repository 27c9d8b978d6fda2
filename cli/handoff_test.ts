import assert from "node:assert/strict";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { HANG_MS } from "../testing/bounds.ts";
import { handoffArgs, runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

const PROMPT = "the quick brown fox jumps over the lazy dog and ".repeat(60);

Deno.test("handoff from the CLI prints what generate prints, with equal logits in probe mode", async () => {
  const model = await testModel("hybrid");
  const cluster = await startLocalCluster({ args: ["--model", model] });
  const handoffCli = (...extra: string[]) =>
    runCliProcess([
      ...handoffArgs(cluster),
      "--prompt",
      PROMPT,
      "-n",
      "16",
      // Prefill and generation are compute: only a hang watchdog, not the 2-minute default.
      "--timeout-ms",
      String(HANG_MS),
      ...extra,
    ]);
  try {
    const handoff = await handoffCli("--json", "--probe");
    assert.equal(handoff.code, 0, handoff.stderr);
    const h = JSON.parse(handoff.stdout);
    const local = await runCliProcess([
      "generate",
      "--model",
      model,
      "--prompt",
      PROMPT,
      "-n",
      "16",
      "--json",
      "--probe",
    ]);
    assert.equal(local.code, 0, local.stderr);
    const g = JSON.parse(local.stdout);
    assert.equal(h.placement, "disaggregated");
    assert.deepEqual(h.tokens, g.tokens);
    assert.deepEqual(h.logitsSha256, g.logitsSha256);
    assert.equal(h.text, g.text);
    // Plain mode streams the same text to stdout and the telemetry line to stderr.
    const plain = await handoffCli();
    assert.equal(plain.code, 0, plain.stderr);
    assert.equal(plain.stdout.trimEnd(), g.text.trimEnd());
    assert.match(plain.stderr, /telemetry: prefill->decode/);
  } finally {
    await cluster.stop();
  }
});

Deno.test("handoff to a peer that is not trusted fails with a one-line error", async () => {
  const state = await Deno.makeTempDir();
  const r = await runCliProcess([
    "handoff",
    "--prefill",
    "aaaaaaaaaaaaaaaa@127.0.0.1:9",
    "--decode",
    "bbbbbbbbbbbbbbbb@127.0.0.1:9",
    "--state-dir",
    state,
    "--prompt",
    "x",
  ]);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /^error: Peer "aaaaaaaaaaaaaaaa" at 127.0.0.1:9 is not in the trust list/);
  assert.match(r.stderr, /hint: add it with `skippy-disagg trust add/);
  await Deno.remove(state, { recursive: true });
});
