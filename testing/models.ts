/**
 * Test fixtures: tiny random-weight models, generated once per checkout into `.cache/` (git
 * ignores it) and reused by every test file. Real llama.cpp loads them; nothing here fakes the
 * runtime.
 */
import {
  buildSpmVocab,
  encodeGguf,
  ensureModelFile,
  GENERATOR_VERSION,
  type GgufMetadata,
  gv,
  layoutGguf,
  makeModel,
  writeChunksToFile,
} from "../models/mod.ts";

const DIR = new URL("../.cache/test-models", import.meta.url).pathname;

/** Path to the test model of `family` (seed 0), made on first use. */
export function testModel(family: string, preset = "tiny"): Promise<string> {
  return ensureModelFile(DIR, { family, preset, seed: 0 });
}

/** The families that have a `lab-state` preset. */
export type LabStateFamily = "hybrid" | "hybrid-moe-mtp";

/**
 * Path to the `lab-state` model of `family` (seed 0): Nemotron 3 Super's 88-layer pattern and
 * exact state dimensions (8,192 B/token F16 KV, 172,687,360 B recurrent state) in about
 * 150 MiB. Made once per checkout into `.cache/test-models` (about 2 s) and shared by tests.
 */
export function labStateModel(family: LabStateFamily = "hybrid"): Promise<string> {
  return testModel(family, "lab-state");
}

/** Deterministic non-special token ids (no tokenizer needed). */
export function testTokens(n: number, nVocab = 950, salt = 0): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = 3 + ((i * 7919 + salt * 104729) % (nVocab - 3));
  return out;
}

/** ChatML's markers, control tokens of the chat test model. */
export const CHATML_MARKERS = ["<|im_start|>", "<|im_end|>"] as const;

/**
 * The chat test model's template: ChatML, with each message's content trimmed (as Llama 3's
 * template does), so the API must match trimmed content to tell markers from content.
 */
export const CHATML_TEMPLATE = "{% for message in messages %}" +
  "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}" +
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/**
 * Path to a tiny `dense` model (seed 0) whose vocabulary has ChatML's two markers as control
 * tokens (in place of its last two word pieces, so every tensor keeps its shape) and whose
 * `tokenizer.chat_template` writes them: a real GGUF that llama.cpp loads, for testing that a
 * template's markers become special tokens and a client's text never does.
 */
export async function chatTemplateModel(): Promise<string> {
  const made = makeModel({ family: "dense", preset: "tiny", seed: 0 });
  const vocab = buildSpmVocab();
  const tokens = [...vocab.tokens];
  const types = [...vocab.types];
  const CONTROL = 3;
  CHATML_MARKERS.forEach((marker, i) => {
    tokens[tokens.length - 1 - i] = marker;
    types[types.length - 1 - i] = CONTROL;
  });
  const metadata: GgufMetadata = made.metadata.map(([key, value]) =>
    key === "tokenizer.ggml.tokens"
      ? [key, gv.strs(tokens)]
      : key === "tokenizer.ggml.token_type"
      ? [key, gv.i32s(types)]
      : key === "tokenizer.chat_template"
      ? [key, gv.str(CHATML_TEMPLATE)]
      : [key, value]
  );
  const path = `${DIR}/skippy-dense-chatml-tiny-seed0-g${GENERATOR_VERSION}.gguf`;
  const stat = await Deno.stat(path).catch(() => null);
  if (stat?.isFile && stat.size === layoutGguf(metadata, made.tensors).totalBytes) return path;
  await Deno.mkdir(DIR, { recursive: true });
  await writeChunksToFile(path, encodeGguf(metadata, made.tensors));
  return path;
}
