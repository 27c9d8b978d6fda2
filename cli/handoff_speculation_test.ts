/**
 * Two processes: a decode worker started with `--speculation mtp+suffix` continues a handoff
 * of the hybrid-moe-mtp model with MTP and suffix speculation; the tokens equal colocated
 * target-only generation and colocated speculation, MTP readiness is the verified one, and
 * the decoder's telemetry carries the acceptance counters per source. A seeded sampled request
 * continues the same sampled stream as colocated speculation, which is target-only sampling's.
 */
import assert from "node:assert/strict";
import { startLocalCluster } from "../serve/local_cluster.ts";
import { HANG_MS } from "../testing/bounds.ts";
import { handoffArgs, runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";

const PROMPT = "one two three four five six seven eight nine ten ".repeat(20);
const N = "24";

Deno.test("handoff to a speculating decoder keeps the tokens and reports acceptance", async () => {
  const model = await testModel("hybrid-moe-mtp");
  const cluster = await startLocalCluster({
    args: ["--model", model],
    decodeArgs: ["--speculation", "mtp+suffix"],
  });
  try {
    const handoffCli = (...extra: string[]) =>
      runCliProcess([
        ...handoffArgs(cluster),
        "--prompt",
        PROMPT,
        "-n",
        N,
        "--timeout-ms",
        String(HANG_MS),
        "--json",
        ...extra,
      ]);
    const handoff = await handoffCli();
    assert.equal(handoff.code, 0, handoff.stderr + cluster.decode.log.slice(-8).join("\n"));
    const h = JSON.parse(handoff.stdout);
    const generate = async (...extra: string[]) => {
      const r = await runCliProcess([
        "generate",
        "--model",
        model,
        "--prompt",
        PROMPT,
        "-n",
        N,
        "--json",
        ...extra,
      ]);
      assert.equal(r.code, 0, r.stderr);
      return JSON.parse(r.stdout);
    };
    const plain = await generate();
    const colocated = await generate("--speculation", "mtp+suffix");
    assert.equal(h.placement, "disaggregated");
    assert.deepEqual(h.tokens, plain.tokens);
    assert.deepEqual(colocated.tokens, plain.tokens);
    assert.equal(h.mtpReady, true, "the decoder verified its MTP state");
    const s = h.telemetry.speculation;
    assert.equal(s.mode, "mtp+suffix");
    assert.equal(s.rollback, "native");
    assert.equal(s.mtpReadiness, "lagging-one");
    assert.equal(s.fallback, null);
    assert.ok(s.mtpDrafted > 0 && s.rounds > 0);
    // The same loop colocated: the same rounds and acceptance.
    for (const k of ["rounds", "mtpDrafted", "mtpAccepted", "suffixDrafted", "suffixAccepted"]) {
      assert.equal(s[k], colocated.speculation[k], k);
    }
    // Sampled: the decoder continues the prefiller's sampler state ({ seed, draws }) with the
    // speculative acceptance rule, so the stream equals colocated sampled speculation's.
    const sampled = ["--temperature", "0.5", "--top-k", "20", "--seed", "7"];
    const hs = await handoffCli(...sampled);
    assert.equal(hs.code, 0, hs.stderr);
    const hsj = JSON.parse(hs.stdout);
    const cs = await generate("--speculation", "mtp+suffix", ...sampled);
    assert.equal(hsj.placement, "disaggregated");
    assert.deepEqual(hsj.tokens, cs.tokens, "the same sampled stream after the handoff");
    // ...which is target-only sampling's stream of the same seed (one draw per token).
    assert.deepEqual(hsj.tokens, (await generate(...sampled)).tokens);
    assert.notDeepEqual(hsj.tokens, plain.tokens, "sampled, not greedy");
    const ss = hsj.telemetry.speculation;
    assert.equal(ss.fallback, null, "sampled requests speculate");
    assert.ok(ss.rounds > 0 && ss.mtpDrafted > 0);
    for (const k of ["rounds", "mtpDrafted", "mtpAccepted", "suffixDrafted", "suffixAccepted"]) {
      assert.equal(ss[k], cs.speculation[k], k);
    }
    // A request can override the worker's mode: here, target-only.
    const off = await handoffCli("--speculation", "none");
    assert.equal(off.code, 0, off.stderr);
    const o = JSON.parse(off.stdout);
    assert.deepEqual(o.tokens, plain.tokens);
    assert.equal(o.telemetry.speculation, undefined, "no speculation ran");
  } finally {
    await cluster.stop();
  }
});
