import assert from "node:assert/strict";
import {
  type DecoderTelemetryEvent,
  deriveTelemetry,
  formatTelemetry,
  overlapFraction,
  type PrefillerTelemetryEvent,
} from "./telemetry.ts";

const MIB = 1024 * 1024;

// Prefiller clock: 4 chunks of 100 ms; pages leave 20 ms after each chunk; the last page and
// the snapshot leave after prefill; CommitAck 30 ms after the manifest.
function prefillerEvents(): PrefillerTelemetryEvent[] {
  const e: PrefillerTelemetryEvent[] = [{ type: "request-start", atMs: 1000 }];
  for (let i = 0; i < 4; i++) {
    const done = 1000 + 100 * (i + 1);
    e.push({ type: "prefill-chunk-done", atMs: done, tokens: 512, cached: i === 0 });
    e.push({ type: "export", atMs: done + 1, kind: "kv-page", bytes: 4 * MIB, durationMs: 1 });
    e.push({ type: "chunk-queued", atMs: done + 1, seq: i, kind: "kv-page", bytes: 4 * MIB });
    // Chunk 2's page is slow: it leaves after the last chunk finished (at 1400).
    const sentAt = i === 2 ? 1405 : done + 20;
    e.push({
      type: "chunk-sent",
      atMs: sentAt,
      seq: i,
      kind: "kv-page",
      bytes: 4 * MIB,
      durationMs: 10,
    });
  }
  e.push({ type: "chunk-queued", atMs: 1421, seq: 4, kind: "ssm", bytes: 8 * MIB });
  e.push({ type: "chunk-sent", atMs: 1440, seq: 4, kind: "ssm", bytes: 8 * MIB, durationMs: 19 });
  e.push({ type: "first-token", atMs: 1402 });
  e.push({ type: "manifest-sent", atMs: 1441 });
  e.push({ type: "commit-ack", atMs: 1471 });
  return e;
}

function decoderEvents(): DecoderTelemetryEvent[] {
  return [
    { type: "import", atMs: 5000, kind: "kv-page", bytes: 4 * MIB, durationMs: 2 },
    { type: "manifest-received", atMs: 5100 },
    { type: "import", atMs: 5105, kind: "ssm", bytes: 8 * MIB, durationMs: 5 },
    { type: "committed", atMs: 5112 },
    { type: "ready", atMs: 5112, target: true, mtp: false },
    { type: "token", atMs: 5120 },
    { type: "token", atMs: 5130 },
    { type: "token", atMs: 5150 },
  ];
}

Deno.test("deriveTelemetry() computes tail, overlap and bytes per component from events", () => {
  const t = deriveTelemetry({
    prefiller: prefillerEvents(),
    decoder: decoderEvents(),
    link: { bandwidthBytesPerS: 5e9, rttMs: 0.3 },
  });
  assert.equal(t.promptTokens, 2048);
  assert.equal(t.cachedTokens, 512);
  assert.equal(t.computedTokens, 1536);
  assert.deepEqual(t.bytesByComponent, { "kv-page": 16 * MIB, "ssm": 8 * MIB });
  assert.equal(t.totalBytes, 24 * MIB);
  assert.equal(t.prefillMs, 400);
  assert.equal(t.uncoveredTailMs, 71);
  assert.equal(t.commitRoundTripMs, 30);
  assert.equal(t.commitMs, 12);
  assert.equal(t.importMs, 7);
  assert.equal(t.wireMs, 59);
  assert.equal(t.exportMs, 4);
  // Queued to write start: 9 ms for pages 0, 1 and 3, 94 ms for the slow page 2, 0 for ssm.
  assert.equal(t.queueMs, 3 * 9 + 94);
  // Non-last pages: chunks 0, 1, 2 (12 MiB); chunk 2 left after prefill ended.
  assert.equal(t.overlapFraction, 2 / 3);
  assert.equal(t.firstTokenDelayMs, 2);
  assert.equal(t.ttftMs, 402);
  assert.equal(t.tpotMs, 15);
  assert.equal(t.targetReady, true);
  assert.equal(t.mtpReady, false);
});

Deno.test("overlapFraction() is n/a for a single KV chunk and counts whole chunks", () => {
  assert.equal(overlapFraction([{ kind: "kv-page", bytes: 10, atMs: 1, seq: 0 }], 5), null);
  const sent = [
    { kind: "kv-page" as const, bytes: 30, atMs: 4, seq: 0 },
    { kind: "kv-page" as const, bytes: 10, atMs: 6, seq: 1 },
    { kind: "kv-page" as const, bytes: 50, atMs: 9, seq: 2 },
    { kind: "conv" as const, bytes: 99, atMs: 1, seq: 3 },
  ];
  assert.equal(overlapFraction(sent, 5), 0.75);
  assert.equal(overlapFraction(sent, null), null);
});

Deno.test("the telemetry record holds no content: no tokens, no checksums", () => {
  const t = deriveTelemetry({ prefiller: prefillerEvents(), decoder: decoderEvents() });
  const json = JSON.stringify(t);
  assert.ok(!/checksum|digest|token"?:\s*\[/i.test(json), json);
  for (const value of Object.values(t)) {
    assert.ok(!Array.isArray(value) || value.every((v) => typeof v === "string"));
  }
});

Deno.test("formatTelemetry() is one line and says n/a for what was not measured", () => {
  const full = formatTelemetry(
    deriveTelemetry({
      prefiller: prefillerEvents(),
      decoder: decoderEvents(),
      link: { bandwidthBytesPerS: 5e9, rttMs: 0.3 },
    }),
  );
  assert.ok(!full.includes("\n"));
  assert.match(
    full,
    /prefill->decode 2048 tok \(512 cached\) 24\.0 MiB \[kv-page 16\.0 MiB, ssm 8\.0 MiB\]/,
  );
  assert.match(full, /tail 71\.0 ms overlap 67%/);
  assert.match(full, /MTP not ready/);
  const empty = formatTelemetry(deriveTelemetry({ prefiller: [], decoder: [] }));
  assert.match(empty, /tail n\/a overlap n\/a/);
  assert.match(empty, /TTFT n\/a TPOT n\/a/);
});

Deno.test("retries and fallback reasons are reported by machine-readable reason", () => {
  const events: PrefillerTelemetryEvent[] = [
    { type: "retry", atMs: 1, reason: "connection-lost" },
    { type: "retry", atMs: 2, reason: "reserve-timeout" },
    { type: "fallback", atMs: 3, reason: "probe-failed" },
  ];
  const t = deriveTelemetry({ prefiller: events, decoder: [] });
  assert.equal(t.retries, 2);
  assert.deepEqual(t.retryReasons, ["connection-lost", "reserve-timeout"]);
  assert.equal(t.fallbackReason, "probe-failed");
  assert.match(
    formatTelemetry(t),
    /retries 2 \(connection-lost, reserve-timeout\) fallback probe-failed/,
  );
});

Deno.test("the decoder's parity verdict reaches the record and the line, fields by name only", () => {
  const decoder: DecoderTelemetryEvent[] = [
    { type: "manifest-received" as const, atMs: 10 },
    { type: "committed" as const, atMs: 12 },
    {
      type: "ready" as const,
      atMs: 12,
      target: true,
      mtp: null,
      parity: "not-claimed" as const,
      parityFields: ["computeDevice"],
    },
  ];
  const t = deriveTelemetry({ prefiller: [], decoder });
  assert.equal(t.parity, "not-claimed");
  assert.deepEqual(t.parityFields, ["computeDevice"]);
  assert.match(
    formatTelemetry(t),
    /parity not claimed \(computeDevice; probe digests not compared\)/,
  );
  const bitwise = deriveTelemetry({
    prefiller: [],
    decoder: [{ type: "ready", atMs: 12, target: true, mtp: null, parity: "bitwise" }],
  });
  assert.equal(bitwise.parity, "bitwise");
});

Deno.test("rttMs: the link facts when given, else the shortest reservation round trip", () => {
  const events = [
    ...prefillerEvents(),
    // Two attempts (a retry): the second reservation answered faster.
    { type: "reserved", atMs: 1001, roundTripMs: 0.9 },
    { type: "reserved", atMs: 1002, roundTripMs: 0.4 },
  ] satisfies PrefillerTelemetryEvent[];
  const own = deriveTelemetry({ prefiller: events, decoder: decoderEvents() });
  assert.equal(own.rttMs, 0.4);
  assert.equal(own.bandwidthBytesPerS, null, "no bandwidth without a measurement");
  assert.ok(!("reserveRoundTripMs" in own), "the record has one RTT field");
  const given = deriveTelemetry({
    prefiller: events,
    decoder: decoderEvents(),
    link: { bandwidthBytesPerS: 5e9, rttMs: 0.3 },
  });
  assert.equal(given.rttMs, 0.3);
  const none = deriveTelemetry({ prefiller: prefillerEvents(), decoder: decoderEvents() });
  assert.equal(none.rttMs, null);
});

Deno.test("tailExportMs sums only the export work that started at or after the last chunk's end", () => {
  const e = prefillerEvents(); // pages export 1 ms after each chunk's end
  // As serve/_export_run.ts records it: a chunk's end is its page export's start.
  const paged: PrefillerTelemetryEvent[] = [
    { type: "request-start", atMs: 0 },
    { type: "prefill-chunk-done", atMs: 100, tokens: 512, cached: false },
    { type: "export", atMs: 104, kind: "kv-page", bytes: MIB, durationMs: 4 },
    // Captured recurrent layers of the last chunk, exported while it computed: not tail work.
    { type: "export", atMs: 150, kind: "ssm", bytes: MIB, durationMs: 3 },
    { type: "prefill-chunk-done", atMs: 200, tokens: 512, cached: false },
    { type: "export", atMs: 205, kind: "kv-page", bytes: MIB, durationMs: 5 },
    { type: "export", atMs: 212, kind: "conv", bytes: MIB, durationMs: 2 },
  ];
  assert.equal(deriveTelemetry({ prefiller: paged, decoder: [] }).tailExportMs, 7);
  // The fixture's exports all start after their chunk's end: only the last one counts.
  assert.equal(deriveTelemetry({ prefiller: e, decoder: decoderEvents() }).tailExportMs, 1);
  assert.equal(deriveTelemetry({ prefiller: [], decoder: [] }).tailExportMs, null);
});

Deno.test("a last page captured during the last chunk: its end is the compute end, later work is tail", () => {
  const e: PrefillerTelemetryEvent[] = [
    { type: "request-start", atMs: 0 },
    { type: "prefill-chunk-done", atMs: 100, tokens: 512, cached: false },
    { type: "export", atMs: 104, kind: "kv-page", bytes: MIB, durationMs: 4 },
    // The last page, exported by the capture at 180 while layers after it computed.
    { type: "prefill-chunk-done", atMs: 180, tokens: 512, cached: false },
    { type: "export", atMs: 180, kind: "kv-page", bytes: MIB, durationMs: 0 },
    // Recurrent layers, the last after the last attention layer, captured before compute end.
    { type: "export", atMs: 150, kind: "ssm", bytes: MIB, durationMs: 5 },
    { type: "export", atMs: 190, kind: "ssm", bytes: MIB, durationMs: 5 },
    { type: "prefill-computed", atMs: 200, chunkTokens: 512, chunkMs: 95 },
    { type: "export", atMs: 203, kind: "positions", bytes: 64, durationMs: 3 },
  ];
  const t = deriveTelemetry({ prefiller: e, decoder: [] });
  assert.equal(t.prefillMs, 200);
  assert.equal(t.computedTokens, 1024);
  // The last chunk's own compute, as the prefiller timed it (the rate at the deepest tokens).
  assert.equal(t.lastChunkTokens, 512);
  assert.equal(t.lastChunkMs, 95);
  assert.match(formatTelemetry(t), /last chunk 512 tok in 95\.0 ms/);
  assert.equal(t.tailExportMs, 3); // the positions only: the page and layer came before 200
  assert.equal(t.captureLeadMs, 10); // the last recurrent export at 190, compute end at 200
  // When each recurrent piece was ready to leave: 50 and 10 ms before compute end.
  assert.deepEqual(t.captureSchedule, [[50, MIB], [10, MIB]]);
  assert.match(
    formatTelemetry(t),
    /layers captured over 40\.0 ms, last 10\.0 ms before compute end/,
  );
});

Deno.test("the decoder's recurrent arrivals: the pieces after the first, over the span from its arrival", () => {
  const d: DecoderTelemetryEvent[] = [
    { type: "import", atMs: 10, kind: "kv-page", bytes: 4 * MIB, durationMs: 1 },
    { type: "import", atMs: 100, kind: "conv", bytes: MIB, durationMs: 1 },
    { type: "import", atMs: 150, kind: "ssm", bytes: 4 * MIB, durationMs: 2 },
    { type: "import", atMs: 500, kind: "ssm", bytes: 4 * MIB, durationMs: 2 },
    { type: "import", atMs: 600, kind: "conv", bytes: 0, durationMs: 30 }, // the import step
  ];
  const t = deriveTelemetry({ prefiller: [], decoder: d });
  assert.equal(t.recurrentArrivalBytes, 8 * MIB);
  assert.equal(t.recurrentArrivalMs, 400);
  assert.match(formatTelemetry(t), / recurrent pieces arrived over 400\.0 ms/);
  const none = deriveTelemetry({ prefiller: [], decoder: [] });
  assert.deepEqual([none.recurrentArrivalBytes, none.recurrentArrivalMs], [null, null]);
});

Deno.test("the decoder's tail arrival: the last chunk staged whose frame body arrived in 1 MiB or more", () => {
  const arrival = (bytes: number, ms: number) => ({ arrival: { bytes, ms } });
  const d: DecoderTelemetryEvent[] = [
    {
      type: "import",
      atMs: 10,
      kind: "kv-page",
      bytes: 4 * MIB,
      durationMs: 1,
      ...arrival(4 * MIB, 80),
    },
    {
      type: "import",
      atMs: 150,
      kind: "ssm",
      bytes: 4 * MIB,
      durationMs: 2,
      ...arrival(4 * MIB, 60),
    },
    // Too small to time the link by, and untimed: neither replaces the last large one.
    {
      type: "import",
      atMs: 151,
      kind: "conv",
      bytes: MIB / 8,
      durationMs: 1,
      ...arrival(MIB / 8, 2),
    },
    { type: "import", atMs: 160, kind: "sampler", bytes: 64, durationMs: 0 },
  ];
  const t = deriveTelemetry({ prefiller: [], decoder: d });
  assert.deepEqual([t.tailArrivalBytes, t.tailArrivalMs], [4 * MIB, 60]);
  assert.match(formatTelemetry(t), / last frame arrived at 0\.56 Gb\/s/);
  const none = deriveTelemetry({ prefiller: [], decoder: d.slice(2) });
  assert.deepEqual([none.tailArrivalBytes, none.tailArrivalMs], [null, null]);
});

Deno.test("captureLeadMs: the last recurrent export before compute end, null when it came after", () => {
  const events = (convAt: number, ssmAt: number): PrefillerTelemetryEvent[] => [
    { type: "request-start", atMs: 0 },
    { type: "export", atMs: convAt, kind: "conv", bytes: 64, durationMs: 1 },
    { type: "export", atMs: ssmAt, kind: "ssm", bytes: MIB, durationMs: 2 },
    { type: "prefill-computed", atMs: 200 },
    { type: "export", atMs: 210, kind: "sampler", bytes: 16, durationMs: 1 },
  ];
  // Layer capture: the later of the two recurrent exports counts, whatever the order.
  assert.equal(deriveTelemetry({ prefiller: events(185, 170), decoder: [] }).captureLeadMs, 15);
  // The snapshot exported after compute end (no layer capture): no lead.
  assert.equal(deriveTelemetry({ prefiller: events(150, 205), decoder: [] }).captureLeadMs, null);
  // Nothing recurrent (a dense model): no lead.
  const dense = events(0, 0).filter((e) => e.type !== "export" || e.kind === "sampler");
  assert.equal(deriveTelemetry({ prefiller: dense, decoder: [] }).captureLeadMs, null);
  // Untimed last chunk: null, not 0.
  assert.equal(deriveTelemetry({ prefiller: dense, decoder: [] }).lastChunkMs, null);
});

Deno.test("the tail and TTFT count from the last chunk's compute end when the prefiller reports it", () => {
  // Layer capture: the last chunk computed at 1300, its captured layers drained into a slow
  // link until 1400, when its page export started (the fixture's last chunk-done).
  const e = prefillerEvents();
  e.splice(1, 0, { type: "prefill-computed", atMs: 1300 });
  const t = deriveTelemetry({ prefiller: e, decoder: decoderEvents() });
  assert.equal(t.prefillMs, 300);
  assert.equal(t.uncoveredTailMs, 171); // CommitAck at 1471
  assert.equal(t.firstTokenDelayMs, 102);
  const old = deriveTelemetry({ prefiller: prefillerEvents(), decoder: decoderEvents() });
  assert.equal(old.prefillMs, 400); // an older prefiller: the last chunk-done stands in
});

Deno.test("deriveTelemetry(): chunks exported before the previous write ended are the backlog, timed end to end", () => {
  const e: PrefillerTelemetryEvent[] = [{ type: "request-start", atMs: 0 }];
  const sent = (seq: number, readyAtMs: number, startMs: number, endMs: number) => {
    e.push({ type: "chunk-queued", atMs: startMs, seq, kind: "ssm", bytes: 4 * MIB, readyAtMs });
    e.push({
      type: "chunk-sent",
      atMs: endMs,
      seq,
      kind: "ssm",
      bytes: 4 * MIB,
      durationMs: endMs - startMs,
    });
  };
  sent(0, 0, 0, 300); // an idle link: not behind anything
  sent(1, 250, 302, 700); // waited for write 0: 400 ms from its end (2 ms handing over)
  sent(2, 690, 700, 1100); // waited for write 1: 400 ms
  sent(3, 1500, 1500, 1800); // exported after write 2 ended: not a backlog
  sent(4, 1900, 1900, 2200); // no readiness known (below): not counted
  e.splice(-2, 1, { type: "chunk-queued", atMs: 1900, seq: 4, kind: "ssm", bytes: 4 * MIB });
  const t = deriveTelemetry({ prefiller: e, decoder: [] });
  assert.equal(t.backlogBytes, 8 * MIB);
  assert.equal(t.backlogMs, 800);
  assert.equal(t.wireMs, 300 + 398 + 400 + 300 + 300);
  assert.match(formatTelemetry(t), / backlog 8\.0 MiB at 0\.08 Gb\/s/);
  assert.doesNotMatch(formatTelemetry({ ...t, backlogBytes: 0, backlogMs: 0 }), /backlog/);
});

Deno.test("deriveTelemetry(): a chunk behind a small write is no backlog unless that write began full", () => {
  const e: PrefillerTelemetryEvent[] = [{ type: "request-start", atMs: 0 }];
  const sent = (seq: number, kind: "conv" | "ssm", bytes: number, ready: number, end: number) => {
    e.push({ type: "chunk-queued", atMs: ready, seq, kind, bytes, readyAtMs: ready });
    e.push({ type: "chunk-sent", atMs: end, seq, kind, bytes, durationMs: end - ready });
  };
  // An idle link: a layer's small conv piece, then its ssm piece, exported together. The conv
  // write did not fill the window, so the ssm write's time is not the link's.
  sent(0, "conv", 128 * 1024, 0, 1);
  sent(1, "ssm", 4 * MIB, 0, 60);
  // The next layer, exported before that ssm write ended (the window full): both pieces count.
  sent(2, "conv", 128 * 1024, 50, 70);
  sent(3, "ssm", 4 * MIB, 50, 400);
  const t = deriveTelemetry({ prefiller: e, decoder: [] });
  assert.equal(t.backlogBytes, 4 * MIB + 128 * 1024);
  assert.equal(t.backlogMs, 340);
});
