/**
 * The decode worker's answer stays bounded per message however long the generation: tokens
 * go out in TokenBatch messages bounded by count and text bytes, probe digests travel with
 * their batch, telemetry is a fixed-size summary, and a result that a bound refuses becomes
 * a failure the client is told about, never silence.
 */
import assert from "node:assert/strict";
import { DecoderTelemetry, StateValidationError } from "../core/mod.ts";
import type { Vocab } from "../ffi/mod.ts";
import { encodeFrame, type FrameLimits, type PeerConnection } from "../transport/mod.ts";
import type { GeneratedStep } from "./generation.ts";
import {
  CONTROL_FRAME_LIMITS,
  type GenerateRequest,
  parseMessage,
  TOKEN_BATCH_TEXT_BYTES_MAX,
  TOKEN_BATCH_TOKENS_MAX,
  type TokenBatch,
} from "./messages.ts";
import { logitsDigest } from "./probe.ts";
import { sendDone, streamTokens } from "./token_stream.ts";

/** A connection that encodes every message as the transport would, and keeps the headers. */
function recordingPeer(limits: FrameLimits = CONTROL_FRAME_LIMITS) {
  const sent: Record<string, unknown>[] = [];
  const sizes: number[] = [];
  const peer = {
    send(header: Record<string, unknown>, payload?: Uint8Array): Promise<void> {
      try {
        const frame = encodeFrame(header, payload, { limits }); // throws past a bound
        sizes.push(frame.head.length);
        sent.push(structuredClone(header));
        return Promise.resolve();
      } catch (error) {
        return Promise.reject(error);
      }
    },
  };
  return { peer: peer as unknown as PeerConnection, sent, sizes };
}

/**
 * Pieces of varied length: mostly short, every 97th token 2 KiB of 3-byte characters, and
 * token 5 split across two tokens (an incomplete UTF-8 sequence, completed by the next).
 */
const encoder = new TextEncoder();
const LONG = encoder.encode("\u20ac".repeat(700));
function pieceBytes(token: number): Uint8Array {
  if (token % 97 === 0) return LONG;
  if (token === 5) return new Uint8Array([0xe2, 0x82]);
  if (token === 6) return new Uint8Array([0xac]);
  return encoder.encode(` w${token}`);
}
const vocab = { pieceBytes } as unknown as Vocab;

function tokensOf(n: number): number[] {
  return Array.from({ length: n }, (_, i) => (i === 4 ? 5 : i === 5 ? 6 : i + 7));
}

async function* stepsOf(tokens: number[], firstHasLogits = false): AsyncGenerator<GeneratedStep> {
  for (const [i, token] of tokens.entries()) {
    const logits = i === 0 && !firstHasLogits ? null : new Float32Array([token, i, 0.5]);
    yield { token, logits };
  }
}

function request(over: Partial<GenerateRequest> = {}): GenerateRequest {
  return {
    type: "GenerateRequest",
    handoffId: "h1",
    tenantId: "t",
    generateTokens: 0,
    mode: "committed",
    prompt: null,
    sampling: null,
    probe: true,
    sentTokens: [],
    ...over,
  };
}

function expectedText(tokens: number[]): string {
  const d = new TextDecoder();
  return tokens.map((t) => d.decode(pieceBytes(t), { stream: true })).join("") + d.decode();
}

Deno.test("10,000 generated tokens stream in bounded TokenBatch messages, digests alongside", async () => {
  const tokens = tokensOf(10_000);
  const { peer, sent, sizes } = recordingPeer();
  const telemetry = new DecoderTelemetry();
  await streamTokens(peer, request(), stepsOf(tokens), telemetry, vocab);
  const batches = sent.map((h) => parseMessage<TokenBatch>(h));
  assert.ok(batches.length >= tokens.length / TOKEN_BATCH_TOKENS_MAX);
  for (const b of batches) {
    assert.ok(b.tokens.length <= TOKEN_BATCH_TOKENS_MAX);
    assert.ok(encoder.encode(b.text).length < TOKEN_BATCH_TEXT_BYTES_MAX + LONG.length);
  }
  assert.ok(Math.max(...sizes) <= CONTROL_FRAME_LIMITS.headerBytesMax);
  assert.deepEqual(batches.flatMap((b) => b.tokens), tokens);
  assert.equal(batches.map((b) => b.text).join(""), expectedText(tokens));
  // The first token's logits came from the prefiller: no digest for it here.
  const digests = batches.flatMap((b) => b.logitsSha256);
  assert.equal(digests.length, tokens.length - 1);
  assert.equal(digests[0], await logitsDigest(new Float32Array([tokens[1], 1, 0.5])));
  // The summary that ends the stream does not grow with the generation.
  const summary = telemetry.summary();
  assert.equal(summary.tokens, tokens.length);
  const done = recordingPeer();
  await sendDone(done.peer, "h1", { ok: true, message: null }, summary, null);
  assert.ok(done.sizes[0] < 512, `${done.sizes[0]} bytes`);
});

Deno.test("a token the client already has is checked and not sent again, text intact", async () => {
  const tokens = tokensOf(40);
  const { peer, sent } = recordingPeer();
  const req = request({ sentTokens: [tokens[0]], mode: "local" });
  await streamTokens(peer, req, stepsOf(tokens, true), new DecoderTelemetry(), vocab);
  const batches = sent.map((h) => parseMessage<TokenBatch>(h));
  assert.deepEqual(batches.flatMap((b) => b.tokens), tokens.slice(1));
  // The client printed the first piece already; the rest is exactly what follows it.
  const first = new TextDecoder().decode(pieceBytes(tokens[0]), { stream: true });
  assert.equal(first + batches.map((b) => b.text).join(""), expectedText(tokens));
  // Digests stay aligned with tokens: the skipped token's digest is not sent either.
  assert.equal(batches.flatMap((b) => b.logitsSha256).length, tokens.length - 1);
});

Deno.test("a continuation whose first token differs from the one sent fails loudly", async () => {
  const tokens = tokensOf(8);
  const { peer, sent } = recordingPeer();
  const req = request({ sentTokens: [tokens[0] + 1] });
  await assert.rejects(
    () => streamTokens(peer, req, stepsOf(tokens), new DecoderTelemetry(), vocab),
    StateValidationError,
  );
  assert.equal(sent.length, 0);
});

Deno.test("a result a frame bound refuses reaches the client as a failure naming the bound", async () => {
  // A peer with a tiny header bound: the full GenerateDone does not fit, its explanation does.
  const { peer, sent } = recordingPeer({ headerBytesMax: 200, payloadBytesMax: 0 });
  await sendDone(peer, "h1", { ok: true, message: "x".repeat(400) }, null, null);
  assert.equal(sent.length, 1);
  assert.equal(sent[0].type, "GenerateDone");
  assert.equal(sent[0].ok, false);
  assert.match(String(sent[0].message), /Cannot send the GenerateDone result: .*headerBytesMax/);
});
