/**
 * Seeded random numbers for model weights, chosen so the same seed gives byte-identical files
 * on every machine: xoshiro128** (32-bit integer ops only) seeded by splitmix32, and an
 * approximately normal variate built from sums of uniforms (Irwin-Hall, four terms) instead of
 * Box-Muller, because `Math.log`/`Math.cos` are not guaranteed to round identically across
 * JavaScript engines. Uniforms carry 24 bits, so every intermediate is exact in float64 until
 * the final scale.
 *
 * Each tensor gets its own stream keyed by (seed, tensor name): a tensor's values do not
 * depend on which tensors come before it.
 */
import { assert } from "../core/errors.ts";

/** Values per yielded block: small enough to stay in cache, large enough to amortise calls. */
export const BLOCK_VALUES = 1 << 16;
const SQRT3 = 1.7320508075688772;
const TWO_POW_MINUS_24 = 1 / (1 << 24);

function fnv1a32(text: string): number {
  let h = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(text)) {
    h ^= byte;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

function splitmix32(state: { x: number }): number {
  state.x = (state.x + 0x9e3779b9) >>> 0;
  let z = state.x;
  z = Math.imul(z ^ (z >>> 16), 0x21f0aaad);
  z = Math.imul(z ^ (z >>> 15), 0x735a2d97);
  return (z ^ (z >>> 15)) >>> 0;
}

/** xoshiro128** by Blackman and Vigna. */
export class Rng {
  #s0: number;
  #s1: number;
  #s2: number;
  #s3: number;

  /** A stream for `(seed, key)`; `seed` is an unsigned 32-bit integer. */
  constructor(seed: number, key: string) {
    assert(Number.isInteger(seed) && seed >= 0 && seed <= 0xffffffff, `bad seed ${seed}`);
    const mix = { x: (seed ^ Math.imul(fnv1a32(key), 0x85ebca6b)) >>> 0 };
    splitmix32(mix); // decorrelate seeds that differ in one bit
    mix.x = (mix.x ^ fnv1a32(key)) >>> 0;
    this.#s0 = splitmix32(mix);
    this.#s1 = splitmix32(mix);
    this.#s2 = splitmix32(mix);
    this.#s3 = splitmix32(mix) | 1; // never the all-zero state
  }

  /** Next raw 32-bit output. */
  nextU32(): number {
    const s1 = this.#s1;
    const result = Math.imul(rotl(Math.imul(s1, 5), 7), 9) >>> 0;
    const t = s1 << 9;
    this.#s2 ^= this.#s0;
    this.#s3 ^= this.#s1;
    this.#s1 ^= this.#s2;
    this.#s0 ^= this.#s3;
    this.#s2 ^= t;
    this.#s3 = rotl(this.#s3, 11);
    return result;
  }

  /** Uniform in [0, 1) with 24 random bits (exact in float32). */
  uniform(): number {
    return (this.nextU32() >>> 8) * TWO_POW_MINUS_24;
  }

  /** Mean 0, variance 1, bell-shaped, bounded by +-2*sqrt(3). */
  normalish(): number {
    return (this.uniform() + this.uniform() + this.uniform() + this.uniform() - 2) * SQRT3;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/** `count` values of `mean + std * normalish()`, in blocks. */
export function* normalBlocks(
  rng: Rng,
  count: number,
  std: number,
  mean = 0,
): Generator<Float32Array> {
  for (let done = 0; done < count;) {
    const block = new Float32Array(Math.min(BLOCK_VALUES, count - done));
    for (let i = 0; i < block.length; i++) block[i] = mean + std * rng.normalish();
    done += block.length;
    yield block;
  }
}

/** `count` values uniform in [lo, hi), in blocks. */
export function* uniformBlocks(
  rng: Rng,
  count: number,
  lo: number,
  hi: number,
): Generator<Float32Array> {
  for (let done = 0; done < count;) {
    const block = new Float32Array(Math.min(BLOCK_VALUES, count - done));
    for (let i = 0; i < block.length; i++) block[i] = lo + (hi - lo) * rng.uniform();
    done += block.length;
    yield block;
  }
}

/** `count` copies of `value`, in blocks. */
export function* constantBlocks(count: number, value: number): Generator<Float32Array> {
  for (let done = 0; done < count;) {
    const block = new Float32Array(Math.min(BLOCK_VALUES, count - done)).fill(value);
    done += block.length;
    yield block;
  }
}
