import assert from "node:assert/strict";
import {
  type SamplerState,
  sampleToken,
  samplingDistribution,
  type SamplingParams,
} from "./sampling.ts";
import { probabilityOf, speculativeRound } from "./speculative_sampling.ts";

const close = (a: number, b: number, msg?: string) => assert.ok(Math.abs(a - b) < 1e-12, msg);

Deno.test("samplingDistribution() gives the exact processed probabilities", () => {
  const logits = new Float32Array([2, 0, 1, -1]);
  // Temperature 0.5 doubles the logit gaps: weights e^0, e^-2, e^-4, e^-6 (sorted by logit).
  const t = samplingDistribution(logits, { temperature: 0.5 });
  assert.deepEqual(t.ids, [0, 2, 1, 3]);
  const z = 1 + Math.exp(-2) + Math.exp(-4) + Math.exp(-6);
  close(probabilityOf(t, 0), 1 / z);
  close(probabilityOf(t, 1), Math.exp(-4) / z);
  // Top-k 2 keeps tokens 0 and 2 and renormalizes over them.
  const k = samplingDistribution(logits, { temperature: 1, topK: 2 });
  close(probabilityOf(k, 2), Math.exp(-1) / (1 + Math.exp(-1)));
  assert.equal(probabilityOf(k, 1), 0);
  // Top-p 0.8: p(0) = 0.644 < 0.8, p(0) + p(2) = 0.881 >= 0.8, so two tokens are kept.
  const p = samplingDistribution(logits, { temperature: 1, topP: 0.8 });
  assert.deepEqual(p.ids, [0, 2]);
  close(probabilityOf(p, 0), 1 / (1 + Math.exp(-1)));
});

Deno.test("greedy rounds are argmax agreement and draw nothing", () => {
  const rows = [
    new Float32Array([0, 5, 1]),
    new Float32Array([3, 0, 1]),
    new Float32Array([0, 0, 9]),
  ];
  const state = { seed: 3, draws: 0 };
  const greedy = { temperature: 0 };
  assert.deepEqual(speculativeRound(rows, [1, 0], greedy, state), { accepted: 2, next: 2 });
  assert.deepEqual(speculativeRound(rows, [1, 2], greedy, state), { accepted: 1, next: 0 });
  assert.deepEqual(speculativeRound(rows, [2, 2], greedy, state), { accepted: 0, next: 1 });
  assert.equal(state.draws, 0);
});

Deno.test("sampled rounds: p = 0 never accepts, p = 1 always does, one draw per token", () => {
  const row = new Float32Array([4, 3, 0, -2]);
  const topTwo = { temperature: 1, topK: 2 };
  const state = { seed: 9, draws: 0 };
  const seen = new Set<number>();
  for (let i = 0; i < 200; i++) {
    // Token 2 is outside the top 2: p = 0, so it is never accepted, and `next` is a top-2 token.
    const r = speculativeRound([row, row], [2], topTwo, state);
    assert.equal(r.accepted, 0);
    assert.ok(r.next === 0 || r.next === 1);
    seen.add(r.next);
  }
  assert.equal(seen.size, 2, "both kept tokens are drawn");
  assert.equal(state.draws, 200, "one draw per emitted token");
  const onlyOne = { temperature: 1, topK: 1 };
  assert.deepEqual(speculativeRound([row, row, row], [0, 0], onlyOne, state), {
    accepted: 2,
    next: 0,
  });
  assert.equal(state.draws, 203);
});

// A toy target over a 6-token vocabulary whose logits depend on the last two tokens, and a
// deterministic drafter that is sometimes right: enough to exercise acceptance, rejection
// with residual draws, and bonus tokens. Math only; no model is involved.
const VOCAB = 6;
function target(ctx: number[]): Float32Array {
  const a = ctx[ctx.length - 1];
  const b = ctx[ctx.length - 2];
  return new Float32Array(VOCAB).map((_, i) =>
    2 * Math.sin(1.7 * a + 0.9 * b + 1.3 * i + 0.4 * i * i)
  );
}
function propose(ctx: number[], k: number): number[] {
  const out: number[] = [];
  const c = [...ctx];
  for (let i = 0; i < k; i++) {
    // Alternately the target's argmax (often accepted) and an arbitrary token.
    const row = target(c);
    const d = i % 2 === 0 ? row.indexOf(Math.max(...row)) : (c[c.length - 1] * 5 + 1) % VOCAB;
    out.push(d);
    c.push(d);
  }
  return out;
}

type Round = typeof speculativeRound;
const LENGTH = 3;
const PARAMS: SamplingParams = { temperature: 0.9, topK: 5, topP: 0.97 };

/** The first LENGTH tokens of a speculative run from context [1, 2] with 2 drafts per round. */
function speculativeSample(state: SamplerState, round: Round = speculativeRound): number[] {
  const ctx = [1, 2];
  const out = [sampleToken(target(ctx), PARAMS, state)];
  ctx.push(out[0]);
  while (out.length < LENGTH) {
    const drafts = propose(ctx, 2);
    const rows = [0, 1, 2].map((i) => target([...ctx, ...drafts.slice(0, i)]));
    const { accepted, next } = round(rows, drafts, PARAMS, state);
    for (const t of [...drafts.slice(0, accepted), next]) {
      out.push(t);
      ctx.push(t);
    }
  }
  return out.slice(0, LENGTH);
}

/** The first LENGTH tokens sampled from the target alone, one draw each. */
function targetOnlySample(state: SamplerState): number[] {
  const ctx = [1, 2];
  const out: number[] = [];
  while (out.length < LENGTH) {
    const t = sampleToken(target(ctx), PARAMS, state);
    out.push(t);
    ctx.push(t);
  }
  return out;
}

/** Exact probability of each LENGTH-token sequence under plain sampling of the target. */
function exactDistribution(): Map<string, number> {
  const out = new Map<string, number>();
  const walk = (ctx: number[], seq: number[], p: number) => {
    if (seq.length === LENGTH) return void out.set(seq.join(","), p);
    const d = samplingDistribution(target(ctx), PARAMS);
    for (const id of d.ids) walk([...ctx, id], [...seq, id], p * probabilityOf(d, id));
  };
  walk([1, 2], [], 1);
  return out;
}

/**
 * Pearson's chi-square of `trials` seeded speculative runs against the exact distribution,
 * bins with expected counts under 5 pooled, and the critical value at alpha = 1e-4
 * (Wilson-Hilferty). Throws when a sequence of probability 0 is drawn.
 */
function chiSquare(trials: number, round?: Round): { stat: number; critical: number } {
  const exact = exactDistribution();
  const counts = new Map<string, number>();
  const state = { seed: 2026, draws: 0 };
  for (let i = 0; i < trials; i++) {
    const key = speculativeSample(state, round).join(",");
    if (!exact.has(key)) throw new Error(`drew ${key}, which has probability 0`);
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  let stat = 0;
  let bins = 0;
  let pooledObserved = 0;
  let pooledExpected = 0;
  for (const [key, p] of exact) {
    const e = p * trials;
    const o = counts.get(key) ?? 0;
    if (e < 5) {
      pooledObserved += o;
      pooledExpected += e;
      continue;
    }
    stat += (o - e) ** 2 / e;
    bins++;
  }
  if (pooledExpected > 0) {
    stat += (pooledObserved - pooledExpected) ** 2 / pooledExpected;
    bins++;
  }
  const df = bins - 1;
  const z = 3.719; // one-sided 1e-4
  const critical = df * (1 - 2 / (9 * df) + z * Math.sqrt(2 / (9 * df))) ** 3;
  return { stat, critical };
}

const TRIALS = 20000;

Deno.test("speculative sampling draws each sequence with the target's exact probability", () => {
  const { stat, critical } = chiSquare(TRIALS);
  console.log(`chi-square ${stat.toFixed(1)} (critical ${critical.toFixed(1)}, ${TRIALS} runs)`);
  assert.ok(stat < critical, `chi-square ${stat} >= ${critical}: not the target's distribution`);
});

Deno.test("the same test rejects a residual that may redraw the rejected draft (it has power)", () => {
  // After a rejection, a fresh draw from p instead of the sample that differed: the rejected
  // draft gets p(d) + (1 - p(d)) p(d) instead of p(d).
  const wrong: Round = (rows, drafts, params, state) => {
    const { accepted } = speculativeRound(rows, drafts, params, state);
    return { accepted, next: sampleToken(rows[accepted], params, state) };
  };
  const { stat, critical } = chiSquare(TRIALS, wrong);
  console.log(`biased rule: chi-square ${stat.toFixed(1)} (critical ${critical.toFixed(1)})`);
  assert.ok(stat > critical, `a biased rule passed: chi-square ${stat} < ${critical}`);
});

Deno.test("a speculative stream is the target-only stream of the same seed, token for token", () => {
  // Each run starts at draw 16 r: a last round may draw past the LENGTH tokens it keeps.
  let accepted = 0;
  for (const seed of [1, 2, 3]) {
    for (let r = 0; r < 100; r++) {
      const spec = speculativeSample({ seed, draws: 16 * r }, (rows, drafts, params, state) => {
        const out = speculativeRound(rows, drafts, params, state);
        accepted += out.accepted;
        return out;
      });
      assert.deepEqual(spec, targetOnlySample({ seed, draws: 16 * r }), `seed ${seed} run ${r}`);
    }
  }
  assert.ok(accepted > 0, "drafts were accepted along the way");
});

Deno.test("seeded speculative sampling is reproducible and resumes from (seed, draws)", () => {
  const a = { seed: 77, draws: 0 };
  const first = Array.from({ length: 40 }, () => speculativeSample(a));
  const b = { seed: 77, draws: 0 };
  const again = Array.from({ length: 20 }, () => speculativeSample(b));
  assert.deepEqual(again, first.slice(0, 20));
  // What a handoff carries: the state after 20 runs continues the same stream elsewhere.
  const moved = { ...b };
  assert.deepEqual(Array.from({ length: 20 }, () => speculativeSample(moved)), first.slice(20));
  const other = { seed: 78, draws: 0 };
  assert.notDeepEqual(Array.from({ length: 40 }, () => speculativeSample(other)), first);
});
