/**
 * One record per request, no content: where it ran and why, token counts, latencies, and the
 * handoff telemetry `runHandoff` returned. Records go to a bounded ring (served by
 * `GET /v1/handoffs?limit=N`, newest first) and, with `--telemetry <file|->`, one JSON line each
 * to a file or stdout.
 */
import type { LinkLossReport } from "../serve/messages.ts";
import type { HandoffTelemetry } from "../core/telemetry.ts";

/** Records the ring keeps (the oldest is dropped beyond this). */
export const HANDOFF_RECORDS_MAX = 1024;

export interface RequestRecord {
  /** ISO time the request finished. */
  time: string;
  requestId: string;
  handoffId: string | null;
  endpoint: "completions" | "chat.completions";
  /** The authenticated key's tenant (a label from the keys file, never the key). */
  tenantId: string;
  /** 200, or the error's HTTP status. */
  status: number;
  /** `stop`, `length`, `abort` (client went away), or `error`. */
  finishReason: "stop" | "length" | "abort" | "error";
  /** What the coordinator planned, and why. */
  plannedPlacement: "disaggregated" | "colocated" | null;
  placementReason: string | null;
  /** Where it actually ran (null when it never reached a worker). */
  placement: "disaggregated" | "colocated" | null;
  fallbackReason: string | null;
  /** One line for a failure (no content). */
  error: string | null;
  promptTokens: number;
  generatedTokens: number;
  queueMs: number;
  ttftMs: number | null;
  tpotMs: number | null;
  e2eMs: number | null;
  /** The handoff's own record (null: cancelled before it returned, or never started). */
  handoff: HandoffTelemetry | null;
  /**
   * The prefill worker's newest datagram loss probe of its link to the decode worker, as its
   * outcome carried it (serve/link_loss.ts; null: none yet, or no prefill worker involved).
   */
  linkLoss: LinkLossReport | null;
}

export class RequestLog {
  #ring: RequestRecord[] = [];
  #sink: ((line: string) => Promise<void>) | null;

  constructor(sink: ((line: string) => Promise<void>) | null = null) {
    this.#sink = sink;
  }

  async add(record: RequestRecord): Promise<void> {
    this.#ring.push(record);
    if (this.#ring.length > HANDOFF_RECORDS_MAX) this.#ring.shift();
    await this.#sink?.(JSON.stringify(record) + "\n");
  }

  /** The newest `limit` records, newest first. */
  recent(limit: number): RequestRecord[] {
    return this.#ring.slice(-limit).reverse();
  }
}

/** A sink for `--telemetry`: `-` is stdout, anything else a file opened for appending. */
export async function openTelemetrySink(
  target: string,
): Promise<{ write: (line: string) => Promise<void>; close: () => void }> {
  const encoder = new TextEncoder();
  if (target === "-") {
    return {
      write: async (line) => void await Deno.stdout.write(encoder.encode(line)),
      close: () => {},
    };
  }
  const file = await Deno.open(target, { create: true, append: true });
  // Lines are written one at a time, in order.
  let chain = Promise.resolve();
  return {
    write: (line) => {
      chain = chain.then(async () => {
        const bytes = encoder.encode(line);
        let off = 0;
        while (off < bytes.length) off += await file.write(bytes.subarray(off));
      });
      return chain;
    },
    close: () => file.close(),
  };
}
