/**
 * Tensor plans: name, shape, storage type and how to initialise the values. A plan becomes a
 * lazily generated `GgufTensor` only when it is encoded, with its own random stream keyed by
 * (seed, name).
 */
import type { WeightType } from "./_gguf_types.ts";
import { constantBlocks, normalBlocks, Rng, uniformBlocks } from "./_prng.ts";
import { elementCount, type GgufTensor } from "./gguf_writer.ts";

export type Init =
  | {
    readonly kind: "normal";
    readonly std: number;
    /** Rows (of `rowLength` values) [first, end) are zero: those tokens never score. */
    readonly zeroRows?: {
      readonly first: number;
      readonly end: number;
      readonly rowLength: number;
    };
  }
  | { readonly kind: "uniform"; readonly lo: number; readonly hi: number }
  | { readonly kind: "constant"; readonly value: number };

export interface TensorPlan {
  readonly name: string;
  readonly shape: readonly number[];
  readonly type: WeightType;
  readonly init: Init;
}

/** Standard deviation of the random matrices: small, so activations and logits stay finite. */
export const MATRIX_STD = 0.02;
/** Embeddings and the output head: a little larger so logits vary between tokens. */
export const EMBEDDING_STD = 0.05;

/** Helpers that name the common shapes of a layer's tensors. */
export class TensorList {
  readonly plans: TensorPlan[] = [];

  constructor(readonly weightType: WeightType) {}

  /** A matrix stored in the model's weight type, N(0, std)-ish. */
  matrix(name: string, shape: readonly number[], std = MATRIX_STD): void {
    this.plans.push({ name, shape, type: this.weightType, init: { kind: "normal", std } });
  }

  /** An f32 tensor of ones (RMS/layer norm weights). */
  norm(name: string, size: number): void {
    this.plans.push({ name, shape: [size], type: "f32", init: { kind: "constant", value: 1 } });
  }

  /** An f32 tensor with the given initialiser. */
  f32(name: string, shape: readonly number[], init: Init): void {
    this.plans.push({ name, shape, type: "f32", init });
  }
}

/** Turns a plan into a tensor whose values are generated when the encoder asks for them. */
export function planToTensor(plan: TensorPlan, seed: number): GgufTensor {
  const count = elementCount(plan.shape);
  const init = plan.init;
  return {
    name: plan.name,
    shape: plan.shape,
    type: plan.type,
    values(): Iterable<Float32Array> {
      switch (init.kind) {
        case "normal": {
          const blocks = normalBlocks(new Rng(seed, plan.name), count, init.std);
          return init.zeroRows ? zeroRange(blocks, init.zeroRows) : blocks;
        }
        case "uniform":
          return uniformBlocks(new Rng(seed, plan.name), count, init.lo, init.hi);
        case "constant":
          return constantBlocks(count, init.value);
      }
    },
  };
}

/** Zeroes the values of rows [first, end) as the blocks stream past (the stream is unchanged). */
function* zeroRange(
  blocks: Iterable<Float32Array>,
  rows: { first: number; end: number; rowLength: number },
): Generator<Float32Array> {
  const lo = rows.first * rows.rowLength;
  const hi = rows.end * rows.rowLength;
  let at = 0;
  for (const block of blocks) {
    const from = Math.max(lo, at);
    const to = Math.min(hi, at + block.length);
    if (from < to) block.fill(0, from - at, to - at);
    at += block.length;
    yield block;
  }
}
