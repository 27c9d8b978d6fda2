/**
 * Safe wrapper for llama.cpp's sampler chains (`llama_sampler`). Disposable.
 *
 * The serving path samples in TypeScript instead (core/sampling.ts), because a handoff must
 * carry the sampler's exact state and llama.cpp's RNG state cannot be exported; this wrapper
 * exists for completeness of the binding and to check that both agree where they can (greedy).
 */
import { RuntimeLibraryError } from "../core/errors.ts";
import type { LlamaContext } from "./context.ts";
import type { LlamaLibrary } from "./library.ts";
import { llama_sampler_chain_params } from "./llama.ts";

export interface LlamaSamplerOptions {
  /** 0 = greedy (the only option that ignores the others). */
  temperature: number;
  topK?: number;
  topP?: number;
  seed?: number;
}

export class LlamaSampler implements Disposable {
  #ptr: Deno.PointerValue;

  private constructor(readonly lib: LlamaLibrary, ptr: Deno.PointerObject) {
    this.#ptr = ptr;
  }

  /** A chain: greedy, or top-k -> top-p -> temperature -> seeded draw. */
  static create(lib: LlamaLibrary, o: LlamaSamplerOptions): LlamaSampler {
    const s = lib.symbols;
    const params = new Uint8Array(llama_sampler_chain_params.size);
    llama_sampler_chain_params.set(params, "no_perf", true);
    const chain = s.llama_sampler_chain_init(params);
    if (chain === null) throw new RuntimeLibraryError("llama_sampler_chain_init failed");
    const sampler = new LlamaSampler(lib, chain);
    if (o.temperature <= 0) {
      sampler.#add(s.llama_sampler_init_greedy());
      return sampler;
    }
    if ((o.topK ?? 0) > 0) sampler.#add(s.llama_sampler_init_top_k(o.topK!));
    if ((o.topP ?? 1) < 1) sampler.#add(s.llama_sampler_init_top_p(o.topP!, 1n));
    sampler.#add(s.llama_sampler_init_temp(o.temperature));
    sampler.#add(s.llama_sampler_init_dist(o.seed ?? 0));
    return sampler;
  }

  #add(child: Deno.PointerValue): void {
    if (child === null) throw new RuntimeLibraryError("Cannot create a llama.cpp sampler");
    this.lib.symbols.llama_sampler_chain_add(this.ptr, child);
  }

  get ptr(): Deno.PointerObject {
    if (this.#ptr === null) throw new Error("Internal error: sampler used after free");
    return this.#ptr;
  }

  /** Samples from output row `i` (-1 = last) of `ctx`'s latest decode, and accepts it. */
  sample(ctx: LlamaContext, i = -1): number {
    return this.lib.symbols.llama_sampler_sample(this.ptr, ctx.ptr, i);
  }

  free(): void {
    if (this.#ptr !== null) {
      this.lib.symbols.llama_sampler_free(this.#ptr);
      this.#ptr = null;
    }
  }

  [Symbol.dispose](): void {
    this.free();
  }
}
