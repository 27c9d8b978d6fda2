import assert from "node:assert/strict";
import type { HandoffTelemetry } from "../core/telemetry.ts";
import { ApiMetrics } from "./metrics.ts";

const value = (text: string, series: string) => {
  const line = text.split("\n").find((l) => l.startsWith(series + " "));
  return line === undefined ? null : Number(line.split(" ")[1]);
};

Deno.test("ApiMetrics counts speculation per source, the decode path and fallbacks by kind", async () => {
  const m = new ApiMetrics({ running: () => 0, waiting: () => 0 });
  const t = {
    decodePath: "per-session",
    speculation: {
      mode: "mtp+suffix",
      rollback: "native",
      mtpReadiness: "ready",
      fallback: null,
      rounds: 5,
      mtpDrafted: 10,
      mtpAccepted: 7,
      suffixDrafted: 4,
      suffixAccepted: 1,
      rolledBack: 6,
    },
  } as unknown as HandoffTelemetry;
  m.observeRequest(t, [
    { kind: "colocated-on-decoder", reason: "r", nodeId: "d", tokensBefore: 0 },
    { kind: "resumed", reason: "r", nodeId: "p", tokensBefore: 3 },
  ]);
  m.observeRequest({ decodePath: "batched" } as HandoffTelemetry, []);
  m.observeRequest({ decodePath: "batched" } as HandoffTelemetry, []);
  m.busyRefusals.inc();
  const text = await m.text();
  assert.equal(value(text, 'skippy:spec_decode_num_draft_tokens_total{source="mtp"}'), 10);
  assert.equal(value(text, 'skippy:spec_decode_num_accepted_tokens_total{source="mtp"}'), 7);
  assert.equal(value(text, 'skippy:spec_decode_num_draft_tokens_total{source="suffix"}'), 4);
  assert.equal(value(text, 'skippy:spec_decode_num_accepted_tokens_total{source="suffix"}'), 1);
  assert.equal(value(text, 'skippy:decode_path_requests_total{path="batched"}'), 2);
  assert.equal(value(text, 'skippy:decode_path_requests_total{path="per-session"}'), 1);
  assert.equal(value(text, 'skippy:request_fallbacks_total{kind="colocated-on-decoder"}'), 1);
  assert.equal(value(text, 'skippy:request_fallbacks_total{kind="resumed"}'), 1);
  assert.equal(value(text, "skippy:busy_refusals_total"), 1);
});
