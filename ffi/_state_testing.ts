/**
 * Test fixtures for state handoff tests: a prefiller context and a decoder context on two
 * separate model instances of the same tiny test model (real llama.cpp, nothing faked).
 */
import { testModel, testTokens } from "../testing/models.ts";
import { type ContextOptions, LlamaContext } from "./context.ts";
import { loadLlama } from "./library.ts";
import { LlamaModel } from "./model.ts";

export const TEST_CONTEXT: ContextOptions = {
  nCtx: 2048,
  nBatch: 256,
  threads: 2,
  flashAttention: false,
  typeK: "f16",
  typeV: "f16",
};

/** Two model instances of `family`; contexts A (prefill) and B (decode), plus MTP drafts. */
export class HandoffPair implements Disposable {
  private constructor(
    readonly models: LlamaModel[],
    readonly a: LlamaContext,
    readonly b: LlamaContext,
    readonly draftA: LlamaContext | undefined,
    readonly draftB: LlamaContext | undefined,
  ) {}

  static async open(
    family: string,
    over: Partial<ContextOptions> = {},
    overB: Partial<ContextOptions> = {},
  ): Promise<HandoffPair> {
    const lib = loadLlama();
    const path = await testModel(family);
    const mtp = family === "hybrid-moe-mtp";
    const ma = await LlamaModel.load(lib, path, { loadMtp: mtp });
    const mb = await LlamaModel.load(lib, path, { loadMtp: mtp });
    const optsA = { ...TEST_CONTEXT, ...over };
    const optsB = { ...optsA, ...overB };
    const a = await LlamaContext.create(ma, optsA);
    const b = await LlamaContext.create(mb, optsB);
    const da = mtp ? await LlamaContext.create(ma, { ...optsA, mtp: true }) : undefined;
    const db = mtp ? await LlamaContext.create(mb, { ...optsB, mtp: true }) : undefined;
    return new HandoffPair([ma, mb], a, b, da, db);
  }

  [Symbol.dispose](): void {
    for (const c of [this.draftA, this.draftB, this.a, this.b]) c?.free();
    for (const m of this.models) m.free();
  }
}

/** A deterministic prompt of `n` tokens for the test tokenizer. */
export function prompt(n: number, salt = 0): Int32Array {
  return testTokens(n, 950, salt);
}

/** Byte view of logits, for bitwise comparison. */
export function bits(values: Float32Array): Uint8Array {
  return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
}
