/**
 * The planner's stream model (core/link_stream.ts, through `estimate()`) against brute-force
 * FIFO simulations of the same link: KV pages per chunk, layer capture in even slices or whole
 * layers, a capture lead, and a last chunk slower than the rest.
 */
import assert from "node:assert/strict";
import { estimate, type PlanInput } from "./planner.ts";
import { planInput } from "./_test_fixtures.ts";
import { TOKEN_BYTES } from "./schema.ts";

const MIB = 1024 * 1024;

const input = planInput;

// Brute force: a FIFO link carrying the token history (final before prefill: serve/exporter.ts)
// and the cached block at t=0, then one page per computed chunk; the overlap counts pages.
function simulate(i: PlanInput) {
  const link = i.link!;
  const bw = link.bandwidthBytesPerS / 1000;
  const tps = i.prefillerPrefillTokensPerS / 1000;
  const cached = i.prefillerCachedTokens ?? 0;
  const history = i.promptTokens * TOKEN_BYTES;
  const releases: { at: number; bytes: number }[] = [];
  if (cached > 0) releases.push({ at: 0, bytes: cached * i.state.kvBytesPerToken });
  let done = 0;
  for (let t = cached; t < i.promptTokens; t += i.chunkTokens) {
    const tokens = Math.min(i.chunkTokens, i.promptTokens - t);
    done += tokens;
    releases.push({ at: done / tps, bytes: tokens * i.state.kvBytesPerToken });
  }
  const prefillEnd = done / tps;
  let clock = link.rttMs + history / bw;
  let early = 0;
  for (const [k, r] of releases.entries()) {
    const start = Math.max(clock, r.at);
    clock = start + r.bytes / bw;
    if (k < releases.length - 1) early += Math.max(0, Math.min(clock, prefillEnd) - start) * bw;
  }
  const nonLast = releases.slice(0, -1).reduce((s, r) => s + r.bytes, 0);
  return {
    uncovered: Math.max(0, clock - prefillEnd),
    overlap: nonLast > 0 ? early / nonLast : null,
  };
}

Deno.test("estimate() agrees with a brute-force FIFO simulation of the page stream", () => {
  let seed = 7;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let k = 0; k < 500; k++) {
    const promptTokens = 1 + Math.floor(random() * 40_000);
    const i = input({
      promptTokens,
      prefillerCachedTokens: random() < 0.3 ? Math.floor(random() * promptTokens) : 0,
      chunkTokens: 1 + Math.floor(random() * 4096),
      prefillerPrefillTokensPerS: 500 + random() * 50_000,
      link: { bandwidthBytesPerS: 1e7 + random() * 1e10, rttMs: random() * 5, ageMs: 0 },
    });
    const e = estimate(i, i.link!);
    const sim = simulate(i);
    const label = JSON.stringify({ promptTokens, c: i.prefillerCachedTokens, ch: i.chunkTokens });
    assert.ok(
      Math.abs(e.uncoveredKvMs - sim.uncovered) < 1e-6 * Math.max(1, sim.uncovered),
      `${label}: ${e.uncoveredKvMs} vs ${sim.uncovered}`,
    );
    assert.equal(e.overlapFraction === null, sim.overlap === null, label);
    if (sim.overlap !== null) {
      assert.ok(
        Math.abs(e.overlapFraction! - sim.overlap) < 1e-6,
        `${label} overlap ${e.overlapFraction} vs ${sim.overlap}`,
      );
    }
  }
});

// The same FIFO with layer capture: the recurrent bytes and the last chunk's page (the capture
// sends it before the chunk ends) leave in `slices` equal pieces released evenly while the last
// chunk computes, the last `leadMs` before its end. Without `pageCaptured` the pieces are the
// recurrent bytes alone and the page leaves at the chunk's end, after them. As the engine
// computes with capture: the prompt's remainder first, every later chunk a full one.
// With `link.tailBytesPerS` the link moves bytes at that rate from prefill end on.
function simulateCapture(i: PlanInput, slices: number, leadMs = 0, pageCaptured = true) {
  const link = i.link!;
  const bw = link.bandwidthBytesPerS / 1000, tailBw = (link.tailBytesPerS ?? 0) / 1000 || bw;
  const tps = i.prefillerPrefillTokensPerS / 1000;
  const cached = i.prefillerCachedTokens ?? 0;
  // The last chunk at its own rate where given (and shorter than the whole prefill), the
  // chunks before it evenly over the rest.
  const computed = i.promptTokens - cached;
  const n = Math.ceil(computed / i.chunkTokens);
  const head = computed - (n - 1) * i.chunkTokens;
  const sizes = [head, ...Array.from({ length: n - 1 }, () => i.chunkTokens)];
  const lastTokens = sizes[n - 1];
  const prefillMs = computed / tps;
  const ownMs = lastTokens / ((i.prefillerLastChunkTokensPerS ?? 0) / 1000);
  const lastMs = n > 1 && ownMs < prefillMs ? ownMs : lastTokens / tps;
  const earlyTps = n > 1 ? (computed - lastTokens) / (prefillMs - lastMs) : tps;
  const endAt = (tokensDone: number) => tokensDone >= computed ? prefillMs : tokensDone / earlyTps;
  // The token history first, at t=0 (serve/exporter.ts), then the cached block.
  const releases = [{ at: 0, bytes: i.promptTokens * TOKEN_BYTES }];
  if (cached > 0) releases.push({ at: 0, bytes: cached * i.state.kvBytesPerToken });
  let done = 0;
  for (const tokens of sizes) {
    const start = endAt(done);
    done += tokens;
    const page = tokens * i.state.kvBytesPerToken;
    if (done + cached >= i.promptTokens) {
      // The last slice leaves `leadMs` before the chunk's end (at the earliest, its start).
      const span = Math.max(0, endAt(done) - start - leadMs);
      const sliced = i.state.recurrentBytes + (pageCaptured ? page : 0);
      for (let k = 1; k <= slices; k++) {
        releases.push({ at: start + (span * k) / slices, bytes: sliced / slices });
      }
      if (!pageCaptured) releases.push({ at: endAt(done), bytes: page });
    } else releases.push({ at: endAt(done), bytes: page });
  }
  let clock = link.rttMs;
  for (const r of releases) {
    const start = Math.max(clock, r.at);
    // The bytes that fit before prefill end go at `bw`, the rest at `tailBw`.
    const early = Math.min(r.bytes, Math.max(0, prefillMs - start) * bw);
    clock = start + early / bw + (r.bytes - early) / tailBw;
  }
  return Math.max(0, clock - prefillMs);
}

// The snapshot's bytes that leave after compute end (neither captured nor known before
// prefill): none here, as these plans have no SWA or MTP state.
function _afterEndBytes(i: PlanInput, snapshotBytes: number): number {
  return snapshotBytes - i.state.recurrentBytes - i.promptTokens * TOKEN_BYTES;
}

// A random plan with layer capture: up to 40K prompt tokens, a cached prefix 3 times in 10,
// chunks up to 4096, 10 MB/s to 10 GB/s, up to 200 MiB recurrent.
function randomCapturePlan(
  random: () => number,
  o: { recurrentLayers?: number; lastPage?: boolean; leadMs?: number; slowerLast?: boolean } = {},
): PlanInput {
  const promptTokens = 1 + Math.floor(random() * 40_000);
  const tps = 500 + random() * 50_000;
  return input({
    promptTokens,
    prefillerCachedTokens: random() < 0.3 ? Math.floor(random() * (promptTokens - 1)) : 0,
    chunkTokens: 1 + Math.floor(random() * 4096),
    prefillerPrefillTokensPerS: tps,
    // Deeper tokens cost more: the last chunk at 20-100% of the average rate.
    ...(o.slowerLast ? { prefillerLastChunkTokensPerS: tps * (0.2 + 0.8 * random()) } : {}),
    link: { bandwidthBytesPerS: 1e7 + random() * 1e10, rttMs: random() * 5, ageMs: 0 },
    snapshotDuringLastChunk: true,
    lastPageDuringLastChunk: o.lastPage ?? true,
    state: {
      kvBytesPerToken: 8192,
      recurrentBytes: random() * 200 * MIB,
      recurrentLayers: o.recurrentLayers,
    },
    ...(o.leadMs === undefined ? {} : { costs: { captureLeadMs: o.leadMs } }),
  });
}

Deno.test("estimate() with layer capture agrees with a FIFO simulation of pages and layers", () => {
  let seed = 11;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let k = 0; k < 300; k++) {
    const i = randomCapturePlan(random);
    const promptTokens = i.promptTokens;
    const e = estimate(i, i.link!);
    // Each slice leaves at the end of its share of the chunk, so the simulation is late by at
    // most one slice's send time against the even release the model takes.
    const slices = 2000;
    const sim = simulateCapture(i, slices);
    const lastTokens = Math.min(i.chunkTokens, promptTokens - (i.prefillerCachedTokens ?? 0));
    const sliced = i.state.recurrentBytes + lastTokens * i.state.kvBytesPerToken;
    const sliceMs = sliced / slices / (i.link!.bandwidthBytesPerS / 1000);
    const modelled = e.uncoveredKvMs + e.snapshotTransferMs -
      _afterEndBytes(i, e.snapshotBytes) / (i.link!.bandwidthBytesPerS / 1000);
    assert.ok(
      modelled <= sim + 1e-6 && sim <= modelled + sliceMs + 1e-6,
      `${JSON.stringify({ promptTokens, ch: i.chunkTokens })}: ${modelled} vs ${sim}`,
    );
  }
});

// Random plans with one piece per recurrent layer against simulateCapture, exact; `lead`: a
// random capture lead and the last page captured or not.
// `tail`: the link 0.3x to 3x as fast from prefill end on (a measured tail rate).
function checkWholeLayers(seed: number, lead: boolean, slowerLast = false, tail = false): void {
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let k = 0; k < 300; k++) {
    const recurrentLayers = 1 + Math.floor(random() * 100);
    const lastPage = lead ? random() < 0.7 : true;
    const leadMs = lead ? random() * 300 : undefined;
    const plan = randomCapturePlan(random, { recurrentLayers, lastPage, leadMs, slowerLast });
    const ratio = tail ? 0.3 + 2.7 * random() : 1;
    const link = { ...plan.link!, tailBytesPerS: plan.link!.bandwidthBytesPerS * ratio };
    const i = tail ? { ...plan, link } : plan;
    const promptTokens = i.promptTokens;
    const e = estimate(i, i.link!);
    const sim = simulateCapture(i, recurrentLayers, leadMs, lastPage);
    const modelled = e.uncoveredKvMs + e.snapshotTransferMs -
      _afterEndBytes(i, e.snapshotBytes) / (i.link!.bandwidthBytesPerS / 1000);
    assert.ok(
      Math.abs(modelled - sim) <= 1e-6 * Math.max(1, sim),
      `${JSON.stringify({ promptTokens, recurrentLayers, leadMs })}: ${modelled} vs ${sim}`,
    );
  }
}

// Lab-state's geometry with layer capture and its last page captured, over a 0.2 ms link.
function labStatePlan(promptTokens: number, tokensPerS: number, bytesPerS: number): PlanInput {
  return input({
    promptTokens,
    chunkTokens: 512,
    prefillerPrefillTokensPerS: tokensPerS,
    link: { bandwidthBytesPerS: bytesPerS, rttMs: 0.2, ageMs: 0 },
    snapshotDuringLastChunk: true,
    lastPageDuringLastChunk: true,
    state: { kvBytesPerToken: 8192, recurrentBytes: 172_687_360, recurrentLayers: 40 },
  });
}

Deno.test("estimate() with layer capture in whole layers equals a FIFO simulation of those layers", () => {
  // One piece per recurrent layer, the last at compute end: its send time stays on the tail.
  checkWholeLayers(23, false);
});

Deno.test("estimate() with a slower last chunk equals a FIFO simulation of chunks at those rates", () => {
  // The same prefill, its last chunk longer and the ones before shorter: the layers spread
  // over a longer last chunk, and less of their send time is left after it.
  checkWholeLayers(31, true, true);
  const i = labStatePlan(2026, 54, 12.2e6);
  const even = estimate(i, i.link!);
  const slower = estimate({ ...i, prefillerLastChunkTokensPerS: 46 }, i.link!);
  assert.equal(slower.prefillerPrefillMs, even.prefillerPrefillMs);
  assert.ok(slower.snapshotTransferMs < even.snapshotTransferMs - 1000);
});

Deno.test("estimate() with a capture lead equals a FIFO simulation of layers released that early", () => {
  // The last layer leaves captureLeadMs before compute end, the others spread over the chunk
  // before it; a lead longer than the chunk releases every layer at its start.
  checkWholeLayers(29, true);
});

Deno.test("estimate() with a tail rate equals a FIFO simulation whose link changes rate at prefill end", () => {
  // What is queued at prefill end drains at the measured tail rate, faster or slower.
  checkWholeLayers(37, true, true, true);
  checkWholeLayers(41, false, false, true);
  // Lab-state 4K at 42 MB/s, the last layer's 4.3 MB leaving 20 ms before compute end.
  const i = { ...labStatePlan(4096, 50, 42e6), costs: { captureLeadMs: 20 } };
  const base = estimate(i, i.link!);
  const fast = estimate(i, { ...i.link!, tailBytesPerS: 2 * i.link!.bandwidthBytesPerS });
  assert.ok(base.uncoveredKvMs + base.snapshotTransferMs > 0);
  const link = (e: typeof base) => e.uncoveredKvMs + e.snapshotTransferMs;
  assert.ok(Math.abs(link(fast) - link(base) / 2) < 1e-9 * link(base));
  assert.equal(fast.tailBytesPerS, 2 * i.link!.bandwidthBytesPerS);
  assert.equal(base.tailBytesPerS, base.linkBytesPerS);
});
