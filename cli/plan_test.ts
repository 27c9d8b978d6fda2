import assert from "node:assert/strict";
import { runCliProcess } from "../testing/cli.ts";
import { testModel } from "../testing/models.ts";
import { parseLinkRate } from "./plan.ts";

/** `plan` for `model` at 8,192 tokens with both nodes' rates stated. */
const ratedPlan = (model: string) => [
  "plan",
  "--model",
  model,
  "--prompt-tokens",
  "8192",
  "--prefiller-rate",
  "4000",
  "--decoder-rate",
  "1000",
];

Deno.test("parseLinkRate() reads 10G, 400M and plain bits/s and refuses nonsense", () => {
  assert.equal(parseLinkRate("10G"), 1e10);
  assert.equal(parseLinkRate("400Mbit"), 4e8);
  assert.equal(parseLinkRate("2.5e9"), 2.5e9);
  assert.throws(() => parseLinkRate("fast"), /expected a link rate/);
  assert.throws(() => parseLinkRate("10"), /1M to 10T/);
});

Deno.test("plan --projection lab --json labels itself a projection and names its placeholders", async () => {
  const r = await runCliProcess(["plan", "--projection", "lab", "--json"]);
  assert.equal(r.code, 0, r.stderr);
  const j = JSON.parse(r.stdout);
  assert.match(j.label, /PROJECTION/);
  assert.match(j.inputs.prefiller.source, /placeholder/);
  assert.deepEqual([...new Set(j.rows.map((x: { linkGbit: number }) => x.linkGbit))], [
    1,
    10,
    16,
    25,
    40,
    100,
  ]);
  // Faster links never lengthen the predicted tail.
  const tail = (g: number) =>
    j.rows.find((x: { linkGbit: number; promptTokens: number }) =>
      x.linkGbit === g && x.promptTokens === 32768
    ).commitTailMs;
  assert.ok(tail(100) < tail(10) && tail(10) < tail(1));
});

Deno.test("plan explains a refusal term by term: uncertified family, slow link, lossy link", async () => {
  const model = await testModel("hybrid");
  const base = ratedPlan(model);
  const dir = await Deno.makeTempDir();
  try {
    const cert = `${dir}/none.json`;
    await Deno.writeTextFile(cert, JSON.stringify({ version: 1, entries: [] }));
    const slow = await runCliProcess([
      ...base,
      "--link",
      "100M",
      "--rtt",
      "2",
      "--loss",
      "0.001",
      "--certification",
      cert,
      "--json",
    ]);
    assert.equal(slow.code, 0, slow.stderr);
    const j = JSON.parse(slow.stdout);
    assert.equal(j.placement, "colocated");
    const codes = j.reasons.map((x: { code: string }) => x.code);
    for (const c of ["not-certified", "link-too-slow", "link-lossy"]) {
      assert.ok(codes.includes(c), codes.join());
    }
    // The stated loss is read as stated (not as one lost ping among the window's last 64).
    const link = j.terms.find((t: { label: string }) => t.label === "link");
    assert.match(link.note, /loss 0\.10% \(stated\)/);
    const labels = j.terms.map((t: { label: string }) => t.label);
    for (
      const l of [
        "uncovered KV transfer",
        "commit round trip",
        "= handoff tail",
        "+ overlap benefit",
        "= benefit",
      ]
    ) {
      assert.ok(labels.includes(l), l);
    }
    const text = await runCliProcess([
      ...base,
      "--link",
      "100M",
      "--rtt",
      "2",
      "--certification",
      cert,
    ]);
    assert.match(text.stdout, /decision: colocated/);
    const none = await runCliProcess([
      "plan",
      "--model",
      model,
      "--prompt-tokens",
      "8192",
      "--link",
      "10G",
      "--rtt",
      "1",
    ]);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /plan needs rates/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("correctness state-handoff --certify writes the file plan reads: certified hybrid disaggregates", async () => {
  const model = await testModel("hybrid");
  const dir = await Deno.makeTempDir();
  try {
    const cert = `${dir}/cert.json`;
    const c = await runCliProcess([
      "correctness",
      "state-handoff",
      "--families",
      "hybrid",
      "--prompt-tokens",
      "300",
      "--page-tokens",
      "256",
      "--steps",
      "2",
      "--variants",
      "in-order",
      "--certify",
      cert,
    ]);
    assert.equal(c.code, 0, c.stderr);
    assert.match(c.stderr, /certified hybrid/);
    const args = [
      ...ratedPlan(model),
      "--link",
      "10G",
      "--rtt",
      "0.2",
      "--certification",
      cert,
      "--json",
    ];
    const j = JSON.parse((await runCliProcess(args)).stdout);
    assert.equal(j.placement, "disaggregated", JSON.stringify(j.reasons));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("plan --congestion-control bbr moves a lossy link's state at the link's rate, and still refuses the loss", async () => {
  const model = await testModel("hybrid");
  const run = async (cc: string) => {
    const r = await runCliProcess([
      ...ratedPlan(model),
      "--link",
      "1G",
      "--rtt",
      "10",
      "--loss",
      "0.001",
      "--congestion-control",
      cc,
      "--json",
    ]);
    assert.equal(r.code, 0, r.stderr);
    return JSON.parse(r.stdout);
  };
  const cubic = await run("cubic"), bbr = await run("bbr");
  const labels = (j: { terms: { label: string }[] }) => j.terms.map((t) => t.label);
  assert.ok(labels(cubic).includes("loss-limited rate"));
  assert.ok(!labels(bbr).includes("loss-limited rate"));
  assert.ok(labels(bbr).includes("congestion control"));
  assert.equal(bbr.estimates.linkBytesPerS, 1e9 / 8);
  assert.ok(bbr.estimates.handoffTailMs < cubic.estimates.handoffTailMs);
  for (const j of [cubic, bbr]) {
    assert.ok(j.reasons.some((x: { code: string }) => x.code === "link-lossy"));
  }
  const bad = await runCliProcess(["plan", "--congestion-control", "reno"]);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /congestion-control/);
});
