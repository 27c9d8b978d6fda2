import assert from "node:assert/strict";
import { explainPlan } from "./plan_explain.ts";
import { plan } from "./planner.ts";
import { planInput } from "./_test_fixtures.ts";

const INPUT = planInput({
  promptTokens: 8192,
  link: { bandwidthBytesPerS: 1.25e9, rttMs: 2, ageMs: 1000 },
  probeMs: 45,
  costs: {
    prefillerPostMs: 1e4,
    importMsPerMiB: 0.5,
    probeWaitMs: 80,
    validateMs: 2,
    linkResidual: { samples: [[2, 30, 1.25e9]] },
  },
});

Deno.test("explainPlan: the tail's terms add up to the handoff tail, then probe and digest wait to the commit tail", () => {
  const p = plan(INPUT);
  const terms = explainPlan(INPUT, p).filter((t) => t.group === "tail");
  const at = terms.findIndex((t) => t.label === "= handoff tail");
  const parts = terms.slice(0, at).reduce((s, t) => s + (t.ms ?? 0), 0);
  assert.ok(Math.abs(parts - p.estimates!.handoffTailMs) < 1e-6, `${parts}`);
  const after = terms.slice(at + 1);
  assert.deepEqual(after.map((t) => t.label), ["+ continuation probe", "+ probe digest wait"]);
  const commit = p.estimates!.handoffTailMs + after.reduce((s, t) => s + t.ms!, 0);
  assert.ok(Math.abs(commit - p.estimates!.commitTailMs!) < 1e-6);
  assert.ok(terms.some((t) => t.label === "prefiller work" && t.ms! > 0), "the slow sender shows");
  assert.equal(terms.find((t) => t.label === "link residual")?.ms, 30);
  assert.equal(terms.find((t) => t.label === "validate")?.ms, 2);
});

Deno.test("explainPlan: a loss-limited link names its rate and the serial KV term uses it", () => {
  const lossy = planInput({
    promptTokens: 8192,
    link: { bandwidthBytesPerS: 1.25e9, rttMs: 2, ageMs: 1000, lossFraction: 0.001 },
  });
  const p = plan(lossy);
  assert.equal(p.estimates!.lossLimited, true);
  const terms = explainPlan(lossy, p);
  const note = terms.find((t) => t.label === "loss-limited rate");
  assert.ok(note, "the loss-limited rate is named");
  assert.match(note.note, /0\.10%/);
  const serial = terms.find((t) => t.label === "- KV transfer (serial)")!;
  assert.ok(
    Math.abs(-serial.ms! - p.estimates!.kvBytes / (p.estimates!.linkBytesPerS / 1000)) < 1e-6,
  );
  assert.equal(explainPlan(INPUT, plan(INPUT)).some((t) => t.label === "loss-limited rate"), false);
});
