/**
 * The recurrent snapshot sent layer by layer while the prompt's last chunk still computes:
 * the shim's layer capture (ffi/layer_capture.ts) copies each Mamba layer's final conv and
 * SSM rows as soon as they are computed, and each layer leaves as one conv run and one ssm
 * run (the first conv run carrying the snapshot header; a run larger than a chunk as byte
 * pieces), exactly the chunks the exporter would cut from a snapshot exported after prefill.
 * In a hybrid model the last chunk's KV page leaves the same way: the capture exports it the
 * moment the last attention layer has written its rows, and it is sent between the recurrent
 * layers that follow. What the capture cannot deliver is exported after prefill instead, and
 * said once.
 */
import { concatBytes, type Range, sayOnce } from "../core/mod.ts";
import type { LlamaContext } from "../ffi/mod.ts";
import { LayerCapture, type LayerCaptureStatus } from "../ffi/layer_capture.ts";
import type { ChunkSink, ExportedChunk } from "./exporter.ts";

/** One layer capture per context, opened on first use (it holds a snapshot-sized buffer). */
const CAPTURES = new WeakMap<LlamaContext, Promise<LayerCaptureStatus>>();

/** The layer capture of `ctx`, or null when it cannot run here (said once, with why). */
export async function openLayerCapture(ctx: LlamaContext): Promise<LayerCapture | null> {
  let opening = CAPTURES.get(ctx);
  if (!opening) CAPTURES.set(ctx, opening = LayerCapture.open(ctx));
  const status = await opening;
  if (status.ok) return status.capture;
  sayOnce(
    `layer capture off (${status.reason}): the recurrent snapshot is exported after prefill`,
  );
  return null;
}

export interface StreamLayersInput {
  capture: LayerCapture;
  /** The model's layer kinds (numerical identity). */
  kinds: readonly string[];
  /** The last chunk's decode; called exactly once. */
  decode: () => Promise<void>;
  finalPos: number;
  sink: ChunkSink;
  /**
   * Makes the chunk of one conv or ssm run over trunk layers `layers`, or its byte pieces
   * when the layer is larger than a chunk.
   */
  chunks: (part: "conv" | "ssm", layers: Range, payload: Uint8Array) => ExportedChunk[];
  /** Receives the index of every recurrent layer sent. */
  sent: Set<number>;
  /**
   * The last chunk's KV page, positions [p0, finalPos + 1), sent as soon as the capture has
   * exported it (`chunk` makes its chunk; `onSent` hears that it left), if it fits `maxBytes`.
   */
  page?: {
    p0: number;
    maxBytes: number;
    chunk: (payload: Uint8Array) => ExportedChunk;
    onSent: () => void;
  };
}

/**
 * Arms the last page where the model has attention layers; returns what sends it once
 * exported (a no-op before that, after it left, or when it cannot be: then it is said once,
 * and the exporter exports it after the decode as before).
 */
async function armPage(o: StreamLayersInput): Promise<() => Promise<void>> {
  const page = o.page;
  if (!page || o.capture.pageLayer < 0) return () => Promise.resolve();
  await o.capture.armPage(page.p0, page.maxBytes);
  let open = true;
  return async () => {
    if (!open) return;
    const got = o.capture.page();
    if (got.state === "pending") return;
    open = false;
    if (got.state === "failed") {
      sayOnce(`last page not captured (${got.reason}): it is exported after prefill`);
      return;
    }
    await o.sink(page.chunk(got.bytes), 0);
    page.onSent();
  };
}

/** Runs the decode with the capture armed, sending each layer as soon as it is final. */
export async function streamLayers(o: StreamLayersInput): Promise<void> {
  const trunkKinds = o.kinds.filter((k) => k !== "mtp");
  const recurrentAt = trunkKinds.flatMap((k, i) => (k === "recurrent" ? [i] : []));
  if (o.capture.nLayers !== recurrentAt.length) return await o.decode();
  await o.capture.arm(0, o.finalPos);
  const sendPage = await armPage(o);
  const done = o.decode();
  try {
    for await (const layer of o.capture.layers(done)) {
      await sendPage();
      const i = layer.index;
      // Layer runs tile the trunk: from this recurrent layer to the next one.
      const a = i === 0 ? 0 : recurrentAt[i];
      const b = i === recurrentAt.length - 1 ? trunkKinds.length : recurrentAt[i + 1];
      const conv = i === 0 ? concatBytes([o.capture.header(), layer.conv]) : layer.conv;
      for (const c of o.chunks("conv", [a, b], conv)) await o.sink(c, 0);
      for (const c of o.chunks("ssm", [a, b], layer.ssm)) await o.sink(c, 0);
      o.sent.add(i);
    }
    await done;
    await sendPage();
  } catch (error) {
    await done; // a failed decode is the error that matters
    sayOnce(
      `layer capture incomplete (${
        (error as Error).message
      }): the remaining layers are exported after prefill`,
    );
  } finally {
    await o.capture.disarm();
  }
  await done;
}
