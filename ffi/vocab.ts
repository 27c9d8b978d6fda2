/**
 * Safe wrapper for the model's vocabulary and tokenizer (`llama_vocab`). The vocabulary is
 * owned by the model; this object must not outlive it.
 */
import { RuntimeLibraryError } from "../core/errors.ts";
import type { LlamaLibrary } from "./library.ts";

export class Vocab {
  readonly nTokens: number;
  readonly bos: number;
  readonly eos: number;
  readonly addBos: boolean;

  constructor(private readonly lib: LlamaLibrary, readonly ptr: Deno.PointerObject) {
    const s = lib.symbols;
    this.nTokens = s.llama_vocab_n_tokens(ptr);
    this.bos = s.llama_vocab_bos(ptr);
    this.eos = s.llama_vocab_eos(ptr);
    this.addBos = s.llama_vocab_get_add_bos(ptr);
  }

  /** Text to token ids. `addSpecial` adds BOS when the model asks for it. */
  tokenize(text: string, addSpecial = true, parseSpecial = false): Int32Array {
    const bytes = new TextEncoder().encode(text);
    let capacity = bytes.length + 8;
    for (let attempt = 0; attempt < 2; attempt++) {
      const out = new Int32Array(capacity);
      const n = this.lib.symbols.llama_tokenize(
        this.ptr,
        bytes,
        bytes.length,
        new Uint8Array(out.buffer),
        capacity,
        addSpecial,
        parseSpecial,
      );
      if (n >= 0) return out.slice(0, n);
      capacity = -n; // llama.cpp returns the negated required size
    }
    throw new RuntimeLibraryError("llama_tokenize failed twice with a larger buffer");
  }

  /** Token ids to text. */
  detokenize(tokens: Int32Array, removeSpecial = true): string {
    let capacity = tokens.length * 8 + 16;
    for (let attempt = 0; attempt < 2; attempt++) {
      const out = new Uint8Array(capacity);
      const n = this.lib.symbols.llama_detokenize(
        this.ptr,
        new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength),
        tokens.length,
        out,
        capacity,
        removeSpecial,
        false,
      );
      if (n >= 0) return new TextDecoder().decode(out.subarray(0, n));
      capacity = -n;
    }
    throw new RuntimeLibraryError("llama_detokenize failed twice with a larger buffer");
  }

  /** The raw bytes of one token's piece (may be a partial UTF-8 sequence). */
  pieceBytes(token: number): Uint8Array {
    const out = new Uint8Array(64);
    let n = this.lib.symbols.llama_token_to_piece(this.ptr, token, out, 64, 0, false);
    if (n >= 0) return out.slice(0, n);
    const big = new Uint8Array(-n);
    n = this.lib.symbols.llama_token_to_piece(this.ptr, token, big, big.length, 0, false);
    return big.slice(0, Math.max(0, n));
  }

  /** Whether `token` is a control token (what a chat template's markers are). */
  isControl(token: number): boolean {
    return this.lib.symbols.llama_vocab_is_control(this.ptr, token);
  }

  isEog(token: number): boolean {
    return this.lib.symbols.llama_vocab_is_eog(this.ptr, token);
  }
}

/** Streams token pieces to text, holding back incomplete UTF-8 sequences. */
export class PieceDecoder {
  #decoder = new TextDecoder("utf-8");
  constructor(private readonly vocab: Vocab) {}
  push(token: number): string {
    return this.#decoder.decode(this.vocab.pieceBytes(token), { stream: true });
  }
  flush(): string {
    return this.#decoder.decode();
  }
}
