/**
 * The handoff's payload path alone, against a raw QUIC stream in the same run: real KV pages
 * exported from a prefilled context are sent as StateChunk frames (binding tag per chunk,
 * framing, credit) and, on the receiving side, tag-checked, SHA-256-checked and appended into
 * an uncommitted import on a second model instance, exactly as a decode worker stages them.
 * Both ends share one process on loopback, so the ratio is what to read.
 */
import {
  computeChunkTag,
  newBindingKey,
  payloadChecksum,
  STATE_SCHEMA_VERSION,
  verifyChunkPayload,
  verifyChunkTag,
} from "../core/mod.ts";
import type { ChunkHeader } from "../core/mod.ts";
import { LlamaContext, LlamaModel, loadLlama } from "../ffi/mod.ts";
import { StagedImport } from "../ffi/staged_import.ts";
import { prefillAndExport } from "../ffi/state_driver.ts";
import { establishPeer } from "../transport/establish.ts";
import { RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { testTokens } from "../testing/models.ts";
import { median } from "./stats.ts";
import { benchPeers, connectRaw, rawTransfer } from "./transport_bench.ts";

export interface PayloadPathResult {
  stateBytes: number;
  pages: number;
  pageTokens: number;
  payloadMBps: number;
  rawMBps: number;
  /** Median of the per-repeat ratios (each repeat runs both paths back to back). */
  ratio: number;
  /** payload / raw of each repeat, in order, and each repeat's rates. */
  ratios: number[];
  payloadMBpsRuns: number[];
  rawMBpsRuns: number[];
}

const DIGEST = "ab".repeat(32);

/** Measures `repeats` transfers of the exported pages of `promptTokens` tokens. */
export async function runPayloadPathBench(o: {
  modelPath: string;
  promptTokens: number;
  pageTokens: number;
  repeats: number;
}): Promise<PayloadPathResult> {
  const lib = loadLlama();
  using modelA = await LlamaModel.load(lib, o.modelPath);
  using modelB = await LlamaModel.load(lib, o.modelPath);
  const options = {
    nCtx: Math.ceil((o.promptTokens + 256) / 256) * 256,
    nBatch: Math.max(o.pageTokens, 512),
    nUbatch: 512,
    threads: RUNTIME_DEFAULTS.threads,
    flashAttention: false,
    typeK: "f16" as const,
    typeV: "f16" as const,
  };
  using a = await LlamaContext.create(modelA, options);
  const state = await prefillAndExport(a, testTokens(o.promptTokens), {
    chunkTokens: o.pageTokens,
  });
  const headers = state.pages.map((page, seq): ChunkHeader => ({
    handoffId: "bench",
    identityDigest: DIGEST,
    schemaVersion: STATE_SCHEMA_VERSION,
    kind: "kv-page",
    layerRange: [0, 1],
    tokenRange: [seq * o.pageTokens, Math.min(o.promptTokens, (seq + 1) * o.pageTokens)],
    codec: "llama-kv-cells",
    dtype: "f16",
    positionConfig: { seqId: 0, nPosPerToken: 1 },
    payloadBytes: page.byteLength,
    checksum: payloadChecksum(page),
    seq,
    final: false,
  }));
  const bytes = state.pages.reduce((n, p) => n + p.byteLength, 0);
  const setup = await benchPeers();
  const payload: number[] = [];
  const raw: number[] = [];
  for (let i = 0; i < o.repeats; i++) {
    using b = await LlamaContext.create(modelB, options);
    // Paired and in alternating order, so a machine that slows down mid-run (other work on
    // the same cores) shifts both paths of a repeat, and neither always runs first.
    const pageBytes = Math.ceil(bytes / state.pages.length);
    if (i % 2 === 0) {
      payload.push(await transferPages(setup, b, state.pages, headers, o.promptTokens));
      raw.push(await rawTransfer(setup, bytes, pageBytes));
    } else {
      raw.push(await rawTransfer(setup, bytes, pageBytes));
      payload.push(await transferPages(setup, b, state.pages, headers, o.promptTokens));
    }
  }
  setup.listener.close();
  const payloadMBps = median(payload);
  const rawMBps = median(raw);
  const ratios = payload.map((x, i) => x / raw[i]);
  return {
    stateBytes: bytes,
    pages: state.pages.length,
    pageTokens: o.pageTokens,
    payloadMBps,
    rawMBps,
    ratio: median(ratios),
    ratios,
    payloadMBpsRuns: payload,
    rawMBpsRuns: raw,
  };
}

async function transferPages(
  setup: Awaited<ReturnType<typeof benchPeers>>,
  decoder: LlamaContext,
  pages: Uint8Array[],
  headers: ChunkHeader[],
  nTokens: number,
): Promise<number> {
  const [clientRaw, serverRaw] = await Promise.all([connectRaw(setup), setup.listener.accept()]);
  const [client, server] = await Promise.all([
    establishPeer(clientRaw, "client", setup.client),
    establishPeer(serverRaw!, "server", setup.server),
  ]);
  const binding = {
    bindingKey: newBindingKey(),
    handoffId: "bench",
    destNodeId: "d",
    tenantId: "t",
  };
  const staged = await StagedImport.open(decoder, { nTokens });
  const started = performance.now();
  const receiving = (async () => {
    let importing = Promise.resolve();
    const receiver = (await server.acceptHandoffStream())!.accept();
    for await (const frame of receiver) {
      const h = frame.header as Record<string, unknown>;
      if (h.type !== "StateChunk") continue;
      const header = h.header as ChunkHeader;
      if (!await verifyChunkTag(binding, header, String(h.tag))) throw new Error("tag");
      verifyChunkPayload(header, frame.payload);
      // As the decode worker does: one page importing while the next arrives.
      await importing;
      importing = staged.addPage(frame.payload);
    }
    await importing;
  })();
  const sender = await client.openHandoffStream({ handoffId: "bench" });
  for (let i = 0; i < pages.length; i++) {
    const tag = await computeChunkTag(binding, headers[i]);
    await sender.send({ type: "StateChunk", header: headers[i], tag } as never, pages[i], {
      payloadChecked: false,
    });
  }
  await sender.finish();
  await receiving;
  const seconds = (performance.now() - started) / 1000;
  await staged.abort();
  await client.close();
  return pages.reduce((n, p) => n + p.byteLength, 0) / 1e6 / seconds;
}
