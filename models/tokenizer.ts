/**
 * The test models' tokenizer: a small SentencePiece-style vocabulary that llama.cpp loads as
 * `tokenizer.ggml.model = "llama"` (SPM). It has `<unk> <s> </s>`, the 256 byte tokens
 * `<0x00>`..`<0xFF>` (type 6) for byte fallback, and a few hundred printable pieces: single
 * characters, `▁`-prefixed letters and common English words with every prefix (so the SPM
 * bigram merge always has a path to them), common suffixes and letter pairs. Any text
 * tokenizes (unknown characters fall back to bytes) and detokenizes to itself.
 *
 * The vocabulary is the same for every family, preset and seed, so all test models share one
 * tokenizer identity.
 */
import { type GgufMetadata, gv } from "./gguf_writer.ts";

/** llama.cpp `llama_token_type` values. */
export const TokenType = {
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  BYTE: 6,
} as const;

export interface SpmVocab {
  readonly tokens: readonly string[];
  readonly scores: readonly number[];
  readonly types: readonly number[];
}

export const UNK_ID = 0;
export const BOS_ID = 1;
export const EOS_ID = 2;
/** SentencePiece's word-boundary marker, U+2581. */
export const SPACE_MARKER = "\u2581";

const PUNCTUATION = ".,;:!?'\"-()[]{}/\\@#$%&*+=<>_|~^`";
const LOWER = "abcdefghijklmnopqrstuvwxyz";
const UPPER = LOWER.toUpperCase();
const DIGITS = "0123456789";

/** Roughly by frequency: earlier pieces get higher scores. */
const WORDS = (
  "the of and to in is that it for was on are as with be by this at from or have an not " +
  "but they his her she he we you all one can had were which their there been has more if " +
  "will would what when out up so about into who them some could time than other then its " +
  "only new these two may first any like now my such make over our even most after also did " +
  "many before must through back years where much your way well down should because each " +
  "just those people how too little state good very world still own see men work long get " +
  "here between both life being under never day same another know while last might us " +
  "great old year off come since against go came right used take three model token " +
  "prefill decode cache layer attention memory stream handoff exact test hello text water " +
  "number sound place word part small large house point thing think"
).split(" ");

/** Words often capitalised at the start of a sentence. */
const SENTENCE_STARTS = "the this it in we you he she they a an and but if what when there".split(
  " ",
);

const SUFFIXES = (
  "s es ed ing er ers est ly tion tions ment ments ness able ible al ial ive ous ity ful " +
  "less ize ise ist ism ance ence ant ent ary ory 're 's 't 'll 've n't"
).split(" ");

const PAIRS = (
  "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le " +
  "ve co me de hi ri ro ic ne ea ra ce li ch ll be ma si om ur"
).split(" ");

function normalPieces(): string[] {
  const pieces = new Set<string>([SPACE_MARKER]);
  for (const ch of LOWER + UPPER + DIGITS + PUNCTUATION) pieces.add(ch);
  for (const ch of LOWER + UPPER + DIGITS) pieces.add(SPACE_MARKER + ch);
  const withPrefixes = (piece: string) => {
    for (let end = 2; end <= piece.length; end++) pieces.add(piece.slice(0, end));
  };
  for (const word of WORDS) withPrefixes(SPACE_MARKER + word);
  for (const word of SENTENCE_STARTS) {
    withPrefixes(SPACE_MARKER + word[0].toUpperCase() + word.slice(1));
  }
  for (const suffix of SUFFIXES) withPrefixes(suffix);
  for (const pair of PAIRS) pieces.add(pair);
  return [...pieces];
}

function byteToken(byte: number): string {
  return `<0x${byte.toString(16).toUpperCase().padStart(2, "0")}>`;
}

/** Builds the vocabulary: special tokens, byte tokens, then printable pieces. */
export function buildSpmVocab(): SpmVocab {
  const tokens = ["<unk>", "<s>", "</s>"];
  const types: number[] = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL];
  const scores = [0, 0, 0];
  for (let byte = 0; byte < 256; byte++) {
    tokens.push(byteToken(byte));
    types.push(TokenType.BYTE);
    scores.push(0);
  }
  normalPieces().forEach((piece, rank) => {
    tokens.push(piece);
    types.push(TokenType.NORMAL);
    // Negative log-probability-like scores; longer pieces win ties so merges go deep.
    scores.push(Math.fround(-1 - rank / 100 + piece.length / 1000));
  });
  return { tokens, scores, types };
}

/** The `tokenizer.ggml.*` metadata for the vocabulary. */
export function tokenizerMetadata(vocab: SpmVocab = buildSpmVocab()): GgufMetadata {
  return [
    ["tokenizer.ggml.model", gv.str("llama")],
    ["tokenizer.ggml.tokens", gv.strs(vocab.tokens)],
    ["tokenizer.ggml.scores", gv.f32s(vocab.scores)],
    ["tokenizer.ggml.token_type", gv.i32s(vocab.types)],
    ["tokenizer.ggml.bos_token_id", gv.u32(BOS_ID)],
    ["tokenizer.ggml.eos_token_id", gv.u32(EOS_ID)],
    ["tokenizer.ggml.unknown_token_id", gv.u32(UNK_ID)],
    ["tokenizer.ggml.add_bos_token", gv.bool(true)],
    ["tokenizer.ggml.add_eos_token", gv.bool(false)],
    ["tokenizer.ggml.add_space_prefix", gv.bool(true)],
  ];
}

/** Deterministic non-special token ids for measurement prompts. */
export function syntheticTokens(n: number, nVocab: number): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = 3 + ((i * 7919) % (nVocab - 3));
  return out;
}
