/**
 * The exporter's side of one prefill handoff (serve/prefill_session.ts): runs the
 * StateExporter over the prompt (chunked prefill, a page per chunk, the tail, the probe) and
 * hands each chunk to the retained state, recording what the prefiller's telemetry needs. The
 * session's transition table decides what leaves and when; this only produces.
 */
import type { FinalManifest, SamplerState } from "../core/mod.ts";
import type { PrefillerTelemetry } from "../core/telemetry.ts";
import {
  DEFAULT_EXPORT_LIMITS,
  type ExportedChunk,
  type ExportResult,
  NO_PREFIX,
  StateExporter,
} from "./exporter.ts";
import { ExportStopped, type RetainedState } from "./_retained_state.ts";
import type { PrefillHandoffInput } from "./prefill_session.ts";

/** Where the export's products go. */
export interface ExportRunSinks {
  telemetry: PrefillerTelemetry;
  retained: RetainedState;
  /** Wakes the session's loop (a chunk to feed, the manifest, the end). */
  wake: () => void;
  /**
   * Every chunk is out of the exporter: the manifest may leave. The probe decode starts once
   * the returned promise settles.
   */
  onTailExported: (manifest: Omit<FinalManifest, "tag">) => Promise<void>;
}

/** How the export ended: its result, or the error that stopped it (null: stopped on purpose). */
export type ExportRunEnd =
  | { done: { result: ExportResult; sampler: SamplerState }; error: null }
  | { done: null; error: unknown };

/**
 * Runs the export of `input.prompt` to its end (or until the retained state stops it).
 *
 * @example
 * ```ts
 * const end = await runExport(input, { telemetry, retained, wake, onTailExported });
 * if (end.done) probeDigest = end.done.result.probeLogitsSha256;
 * ```
 */
export async function runExport(
  input: PrefillHandoffInput,
  sinks: ExportRunSinks,
): Promise<ExportRunEnd> {
  const r = input.request;
  const { engine, identity, draft } = input;
  const { telemetry } = sinks;
  const exporter = new StateExporter(engine, identity, r.handoffId, draft, {
    ...DEFAULT_EXPORT_LIMITS,
    layerCapture: input.limits.layerCapture,
    lastPageCapture: input.limits.lastPageCapture,
    chunkBytesMax: input.limits.chunkBytesMax,
  });
  const { seed, ...sampling } = r.sampling;
  const sampler = { seed, draws: 0 }; // advanced by the first token's draw
  try {
    const result = await exporter.run(
      input.prompt,
      sampling,
      sampler,
      (chunk, exportMs) => _accept(sinks, chunk, exportMs),
      (token, logits, prefillEndMs, lastChunk) => {
        // The last chunk's compute is done: the tail is measured from here.
        telemetry.push({
          type: "prefill-computed",
          atMs: prefillEndMs,
          ...(lastChunk
            ? { chunkTokens: lastChunk.p1 - lastChunk.p0, chunkMs: lastChunk.computeMs }
            : {}),
        });
        if (!input.onFirstToken) return;
        input.onFirstToken(token, logits, prefillEndMs);
        telemetry.push({ type: "first-token", atMs: performance.now() });
      },
      {
        ...NO_PREFIX,
        ...input.prefix,
        // A pure recurrent model streams no pages: its split is reported from here.
        onUnpagedTokens: (tokens, cached) =>
          telemetry.push({ type: "prefill-chunk-done", atMs: performance.now(), tokens, cached }),
      },
      () => {
        const headers = sinks.retained.headers();
        const left = sinks.onTailExported(exporter.manifest(headers, input.prompt.length, null));
        sinks.wake();
        return left;
      },
    );
    return { done: { result, sampler }, error: null };
  } catch (error) {
    return { done: null, error: error instanceof ExportStopped ? null : error };
  }
}

/** The exporter's sink: retain the chunk, then wait while too many bytes are unsent. */
async function _accept(sinks: ExportRunSinks, chunk: ExportedChunk, exportMs: number) {
  const now = performance.now();
  const h = chunk.header;
  if (h.kind === "kv-page") {
    sinks.telemetry.push({
      type: "prefill-chunk-done",
      atMs: now - exportMs,
      tokens: h.tokenRange[1] - h.tokenRange[0],
      cached: chunk.cached === true,
    });
  }
  sinks.telemetry.push({
    type: "export",
    atMs: now,
    kind: h.kind,
    bytes: h.payloadBytes,
    durationMs: exportMs,
  });
  // Wake the loop to feed the chunk to the table.
  await sinks.retained.add(chunk, sinks.wake);
}
