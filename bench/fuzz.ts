/**
 * Seeded fuzzing of everything that parses peer input: the frame decoder (transport/frame.ts),
 * the control message checks (serve/messages.ts `parseMessage`), chunk headers and final
 * manifests (core/chunk.ts, core/manifest.ts) and the two handoff transition tables (which
 * take peer messages as events). Every input must either parse or fail with the typed error of
 * its layer; any other exception is a finding. Each case is synchronous and bounded, so a run
 * cannot hang, and decoded frames are checked against the decoder's size ceilings.
 *
 * A short run is part of the test suite (fuzz_test.ts); a long one:
 *   deno run -A --unstable-net bench/fuzz.ts --iterations 200000 --seed 7
 * A finding prints the target, the seed and the iteration, which reproduce it exactly.
 */
import { parseArgs } from "node:util";
import {
  buildManifest,
  type ChunkHeader,
  componentOf,
  createDecoder,
  createPrefiller,
  decoderStep,
  EVENT_TYPES,
  kvDtype,
  prefillerStep,
  ProtocolError,
  STATE_SCHEMA_VERSION,
  StateValidationError,
  validateChunkHeader,
  validateManifest,
} from "../core/mod.ts";
import { parseMessage } from "../serve/messages.ts";
import { seededRandom } from "../transport/mod.ts";
import {
  encodeFrame,
  FRAME_PREFIX_BYTES,
  FrameDecoder,
  type FrameLimits,
} from "../transport/frame.ts";

/** Small ceilings, so oversized claims are common and cheap to check. */
const LIMITS: FrameLimits = { headerBytesMax: 4096, payloadBytesMax: 64 * 1024 };
const FIELDS = [
  "type",
  "handoffId",
  "tenantId",
  "prompt",
  "generateTokens",
  "sampling",
  "decode",
  "probe",
  "seq",
  "kind",
  "layerRange",
  "tokenRange",
  "payloadBytes",
  "checksum",
  "final",
  "piece",
  "range",
  "of",
  "attempt",
  "grantedBytesTotal",
  "reason",
  "events",
  "tokens",
  "text",
  "ok",
  "requestId",
  "mode",
  "meta",
];
const TYPES = [
  "PrefillRequest",
  "CancelRequest",
  "PrefillOutcome",
  "GenerateRequest",
  "TokenBatch",
  "GenerateDone",
  "StatsRequest",
  "WorkerStats",
  "FirstToken",
  "Progress",
  ...EVENT_TYPES,
  "__proto__",
  "constructor",
  "",
];

type Random = () => number;

/** mulberry32 (transport's seeded PRNG): the same seed gives the same cases. */
const prng = (seed: number): Random => seededRandom(seed);

const int = (r: Random, max: number) => Math.floor(r() * (max + 1));
const pick = <T>(r: Random, xs: readonly T[]): T => xs[int(r, xs.length - 1)];

/** A value of the kinds msgpack can carry (BigInt included: 64-bit integers decode as one). */
function randomValue(r: Random, depth = 0): unknown {
  switch (int(r, depth > 2 ? 8 : 11)) {
    case 0:
      return null;
    case 1:
      return r() < 0.5;
    case 2:
      return pick(r, [0, -1, 1, 2 ** 31, 2 ** 32, 2 ** 53, -(2 ** 53), 1.5, -0, 1e308]);
    case 3:
      return int(r, 10_000);
    case 4:
      return pick(r, [NaN, Infinity, -Infinity]);
    case 5:
      return BigInt(int(r, 1 << 30)) * (r() < 0.5 ? 1n : 2n ** 30n); // fits in 64 bits
    case 6:
      return "x".repeat(int(r, 3) === 0 ? int(r, 300) : int(r, 8));
    case 7:
      return pick(r, TYPES);
    case 8:
      return crypto.getRandomValues(new Uint8Array(int(r, 40)));
    case 9:
      return Array.from({ length: int(r, 4) }, () => randomValue(r, depth + 1));
    case 10:
      return randomMap(r, depth + 1);
    default:
      return [int(r, 8), int(r, 8)];
  }
}

function randomMap(r: Random, depth = 0): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (let i = int(r, 6); i > 0; i--) out[pick(r, FIELDS)] = randomValue(r, depth);
  return out;
}

/** Replaces, deletes or adds a few fields of a copy of `template`, recursing into records. */
function mutate(r: Random, template: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = structuredClone(template);
  for (let i = 1 + int(r, 2); i > 0; i--) {
    const keys = Object.keys(out);
    const key = keys.length > 0 && r() < 0.8 ? pick(r, keys) : pick(r, FIELDS);
    const v = out[key];
    const choice = int(r, 3);
    if (choice === 0) delete out[key];
    else if (choice === 1 && typeof v === "object" && v !== null && !ArrayBuffer.isView(v)) {
      out[key] = Array.isArray(v)
        ? v.map((x) => r() < 0.5 ? randomValue(r, 2) : x)
        : mutate(r, v as Record<string, unknown>);
    } else out[key] = randomValue(r);
  }
  return out;
}

function chunkTemplate(r: Random): ChunkHeader {
  const n = 1 + int(r, 4096);
  if (r() < 0.3) {
    // A byte piece of a recurrent layer larger than a chunk (schema 3).
    const of = 4 * (2 + int(r, 1 << 20));
    const a = 4 * int(r, of / 4 - 1);
    const b = a + 4 * (1 + int(r, (of - a) / 4 - 1));
    return {
      ...chunkTemplate(() => 0.5),
      kind: "ssm",
      tokenRange: [0, n],
      codec: "llama-recurrent-rows",
      dtype: "f32",
      payloadBytes: b - a,
      piece: { range: [a, b], of },
    };
  }
  return {
    handoffId: "h-fuzz",
    identityDigest: "ab".repeat(32),
    schemaVersion: STATE_SCHEMA_VERSION,
    kind: "kv-page",
    layerRange: [0, 6],
    tokenRange: [0, n],
    codec: "llama-kv-cells",
    dtype: kvDtype("f16", "f16"),
    positionConfig: { seqId: 0, nPosPerToken: 1 },
    payloadBytes: n * 64,
    checksum: "0".repeat(63) + "1",
    seq: 0,
    final: true,
  };
}

const MESSAGE_TEMPLATES: Record<string, unknown>[] = [
  {
    type: "PrefillRequest",
    handoffId: "h-1",
    tenantId: "t",
    prompt: "",
    generateTokens: 8,
    sampling: { temperature: 0, topK: 1, topP: 1, seed: 1 },
    decode: { host: "127.0.0.1", port: 4433, nodeId: "n" },
    probe: false,
  },
  {
    type: "GenerateRequest",
    handoffId: "h-1",
    tenantId: "t",
    generateTokens: 4,
    mode: "committed",
  },
  { type: "TokenBatch", handoffId: "h-1", tokens: [1, 2], text: "" },
  { type: "PrefillOutcome", handoffId: "h-1", outcome: "failed", reason: null, events: [] },
  { type: "StatsRequest", requestId: "r" },
];

/** Which typed errors each target may throw; anything else is a finding. */
type Target = (r: Random) => void;

function expectTyped(run: () => void, allowed: readonly (abstract new (...a: never[]) => Error)[]) {
  try {
    run();
  } catch (error) {
    if (allowed.some((c) => error instanceof c)) return;
    throw error;
  }
}

function frameBytes(r: Random): Uint8Array {
  const parts: Uint8Array[] = [];
  for (let i = 1 + int(r, 2); i > 0; i--) {
    const payload = crypto.getRandomValues(new Uint8Array(int(r, 2000)));
    const frame = encodeFrame(randomMap(r), payload, { final: i === 1 && r() < 0.7 });
    parts.push(frame.head.slice(), payload);
  }
  const total = parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) out.set(p, (at += p.length) - p.length);
  // Corrupt: flip bits, overwrite a length, truncate, or append garbage.
  for (let i = int(r, 3); i > 0; i--) {
    const k = int(r, 3);
    if (k === 0) out[int(r, out.length - 1)] ^= 1 << int(r, 7);
    else if (k === 1) {
      new DataView(out.buffer).setUint32(4 + 4 * int(r, 1), pick(r, [0, 1, 2 ** 32 - 1, 70_000]));
    } else if (k === 2) return out.subarray(0, int(r, out.length));
    else return new Uint8Array([...out, ...crypto.getRandomValues(new Uint8Array(int(r, 32)))]);
  }
  return out;
}

const TARGETS: Record<string, Target> = {
  frame(r) {
    const bytes = r() < 0.1 ? crypto.getRandomValues(new Uint8Array(int(r, 64))) : frameBytes(r);
    const decoder = new FrameDecoder(LIMITS);
    expectTyped(() => {
      let at = 0;
      while (at < bytes.length) {
        const take = 1 + int(r, r() < 0.3 ? 16 : bytes.length);
        for (const frame of decoder.push(bytes.subarray(at, at + take))) {
          if (typeof frame.header !== "object" || frame.header === null) {
            throw new Error("decoded header is not a record");
          }
          if (frame.payload.length > LIMITS.payloadBytesMax) throw new Error("payload over limit");
          if (
            frame.wireBytes > FRAME_PREFIX_BYTES + LIMITS.headerBytesMax + LIMITS.payloadBytesMax
          ) {
            throw new Error("frame over limit");
          }
        }
        at += take;
      }
      decoder.finish(r() < 0.5);
    }, [ProtocolError]);
  },
  "frame-ceiling"(r) {
    // A prefix claiming more than the ceilings must fail on the prefix alone, before any body
    // buffer is allocated for it.
    const prefix = new Uint8Array(FRAME_PREFIX_BYTES);
    const view = new DataView(prefix.buffer);
    view.setUint16(0, 0x5344);
    view.setUint8(2, 1);
    const header = r() < 0.5;
    view.setUint32(4, header ? LIMITS.headerBytesMax + 1 + int(r, 2 ** 31) : 1);
    view.setUint32(8, header ? 0 : LIMITS.payloadBytesMax + 1 + int(r, 2 ** 31));
    let threw = false;
    expectTyped(() => {
      try {
        new FrameDecoder(LIMITS).push(prefix);
      } catch (error) {
        threw = true;
        throw error;
      }
    }, [ProtocolError]);
    if (!threw) throw new Error("an oversized frame prefix was accepted");
  },
  message(r) {
    const header = r() < 0.7 ? mutate(r, pick(r, MESSAGE_TEMPLATES)) : randomMap(r);
    if (r() < 0.5) header.type = pick(r, TYPES.slice(0, 8));
    expectTyped(() => parseMessage(header), [ProtocolError]);
  },
  chunk(r) {
    const raw = r() < 0.9
      ? mutate(r, chunkTemplate(r) as unknown as Record<string, unknown>)
      : randomValue(r);
    expectTyped(() => validateChunkHeader(raw), [StateValidationError]);
  },
  manifest(r) {
    const header = chunkTemplate(r);
    const n = header.tokenRange[1];
    const manifest = buildManifest({
      handoffId: "h-fuzz",
      identityDigest: "ab".repeat(32),
      family: "dense",
      components: [componentOf(header)],
      logical: { position: n, tokenCount: n },
    });
    const raw = mutate(
      r,
      { ...manifest, tag: "ee".repeat(32) } as unknown as Record<string, unknown>,
    );
    expectTyped(() => validateManifest(raw, { trunkLayers: 6 }), [StateValidationError]);
  },
  handoff(r) {
    // Peer messages as events of either transition table: rejected, never thrown.
    const event = mutate(r, { type: pick(r, TYPES), handoffId: "h-fuzz", attempt: 1 });
    const decoder = decoderStep(createDecoder(), event as never);
    if (decoder.rejected && !(decoder.rejected instanceof ProtocolError)) {
      throw new Error("decoder rejected with an untyped error");
    }
    const prefiller = createPrefiller({
      handoffId: "h-fuzz",
      tenantId: "t",
      sourceNodeId: "a",
      destNodeId: "b",
      identityDigest: "ab".repeat(32),
      family: "dense",
      promptTokens: 16,
      stateBytesEstimate: 1024,
      contextTokensNeeded: 32,
    });
    let p = prefillerStep(prefiller, { type: "Start" } as never).state;
    for (let i = 0; i < 3; i++) {
      const e = mutate(r, event);
      const result = prefillerStep(p, e as never);
      if (!result.state) {
        throw new Error(
          `prefiller lost its state on ${
            JSON.stringify(e, (_, v) => typeof v === "bigint" ? `${v}n` : v)
          }`,
        );
      }
      if (result.rejected && !(result.rejected instanceof ProtocolError)) {
        throw new Error("prefiller rejected with an untyped error");
      }
      p = result.state;
    }
  },
};

/** One target's run: the first finding stops it and is returned with what reproduces it. */
export interface FuzzResult {
  target: string;
  iterations: number;
  finding: { iteration: number; error: string } | null;
}

/** Runs `iterations` cases of each target from `seed` (target i uses seed + i). */
export function runFuzz(
  options: { seed: number; iterations: number; only?: string[] },
): FuzzResult[] {
  const names = Object.keys(TARGETS).filter((t) => !options.only || options.only.includes(t));
  return names.map((target, i) => {
    const random = prng(options.seed + i);
    for (let iteration = 0; iteration < options.iterations; iteration++) {
      try {
        TARGETS[target](random);
      } catch (error) {
        const e = error as Error;
        return {
          target,
          iterations: iteration + 1,
          finding: { iteration, error: `${e?.constructor?.name}: ${e?.message}`.slice(0, 300) },
        };
      }
    }
    return { target, iterations: options.iterations, finding: null };
  });
}

export const FUZZ_TARGETS: readonly string[] = Object.keys(TARGETS);

const USAGE =
  `usage: deno run -A --unstable-net bench/fuzz.ts [--iterations N] [--seed S] [--only ${
    FUZZ_TARGETS.join(",")
  }]`;

async function main(): Promise<void> {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        iterations: { type: "string", default: "100000" },
        seed: { type: "string", default: String(Date.now() % 1_000_000) },
        only: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (error) {
    console.error(`error: ${(error as Error).message}\n${USAGE}`);
    Deno.exit(2);
  }
  if (values.help) return console.log(USAGE);
  const [iterations, seed] = [Number(values.iterations), Number(values.seed)];
  const only = values.only?.split(",");
  const unknown = only?.find((t) => !FUZZ_TARGETS.includes(t));
  if (
    !Number.isSafeInteger(iterations) || iterations < 1 || !Number.isSafeInteger(seed) || unknown
  ) {
    console.error(`error: bad --iterations, --seed or --only ${unknown ?? ""}\n${USAGE}`);
    Deno.exit(2);
  }
  const t0 = performance.now();
  const results = runFuzz({ seed, iterations, only });
  for (const r of results) {
    const how = r.finding
      ? `FINDING at iteration ${r.finding.iteration}: ${r.finding.error}`
      : "ok";
    console.log(`${r.target.padEnd(14)} ${String(r.iterations).padStart(8)} cases  ${how}`);
  }
  console.log(`seed ${seed}, ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  await Promise.resolve();
  if (results.some((r) => r.finding)) Deno.exit(1);
}

if (import.meta.main) await main();
