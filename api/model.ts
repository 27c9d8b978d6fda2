/**
 * The model the API serves, as the coordinator knows it without running it: its id, its
 * vocabulary (loaded vocab-only through llama.cpp, so prompt tokens are counted exactly as the
 * workers count them, with no weights in memory), its chat template and special tokens from
 * the GGUF metadata, the context size the workers run with, and its state sizes (for
 * placement).
 */
import { basename } from "node:path";
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import {
  expectedStateBytes,
  type GgufReadValue,
  type ModelSpec,
  readGgufFile,
  specFromGguf,
} from "../models/mod.ts";
import { familyOf } from "../serve/identity.ts";
import type { StateSize } from "../core/planner.ts";
import { tokenizePrompt } from "../serve/prompt_tokens.ts";
import { MarkerSet } from "./template_markers.ts";

export interface ServedModel {
  /** What `/v1/models` lists and requests name: the GGUF file name without `.gguf`. */
  id: string;
  /** Other names a request may use: the file name, and `general.name` when present. */
  aliases: string[];
  /** Context tokens of each worker (`serve --ctx`); prompt + max_tokens must fit. */
  nCtx: number;
  /** `tokenizer.chat_template`, or null (the plain fallback is used). */
  chatTemplate: string | null;
  bosText: string;
  eosText: string;
  /** Whether the workers add BOS when they tokenize a prompt. */
  addsBos: boolean;
  family: string;
  state: StateSize;
  /** A token's piece, as bytes (for log probabilities' token strings). */
  pieceBytes(token: number): Uint8Array;
  /** The vocabulary's control tokens: what a chat template's markers become. */
  markers: MarkerSet;
  /**
   * Prompt tokens as the workers will count them (BOS included when the model adds it; a
   * chat template's marker spans as one special token each, see serve/prompt_tokens.ts).
   */
  countTokens(text: string, specialSpans?: number[]): number;
  close(): void;
}

function metaString(value: GgufReadValue | undefined): string | null {
  return value && typeof value.value === "string" ? value.value : null;
}

/** Opens `path` for serving: reads its metadata and loads its vocabulary only. */
export async function openServedModel(path: string, nCtx: number): Promise<ServedModel> {
  const header = await readGgufFile(path);
  const spec: ModelSpec = specFromGguf(header, path);
  const meta = header.metadata;
  const tokens = meta.get("tokenizer.ggml.tokens")?.value;
  const tokenText = (key: string): string => {
    const id = meta.get(key)?.value;
    return Array.isArray(tokens) && typeof id === "number" ? String(tokens[id] ?? "") : "";
  };
  const model = await LlamaModel.load(loadLlama(), path, { vocabOnly: true, gpuLayers: 0 });
  const file = basename(path);
  const id = file.replace(/\.gguf$/i, "");
  const generalName = metaString(meta.get("general.name"));
  const sizes = expectedStateBytes(spec);
  return {
    id,
    aliases: [file, ...(generalName && generalName !== id ? [generalName] : [])],
    nCtx,
    chatTemplate: metaString(meta.get("tokenizer.chat_template")),
    bosText: tokenText("tokenizer.ggml.bos_token_id"),
    eosText: tokenText("tokenizer.ggml.eos_token_id"),
    addsBos: model.vocab.addBos,
    family: familyOf(spec),
    state: {
      kvBytesPerToken: sizes.kvBytesPerToken,
      recurrentBytes: sizes.recurrentBytes,
      recurrentLayers: sizes.layers.recurrent,
      swaBytes: sizes.swaKvBytesPerToken * sizes.slidingWindow,
      mtpBytesPerToken: sizes.mtpKvBytesPerToken,
    },
    pieceBytes: (token) => model.vocab.pieceBytes(token),
    markers: new MarkerSet(controlTokenTexts(meta)),
    countTokens: (text, spans) => tokenizePrompt(model.vocab, text, spans).length,
    close: () => model.free(),
  };
}

/** CONTROL tokens (`tokenizer.ggml.token_type` 3) of the GGUF vocabulary, by text. */
function controlTokenTexts(meta: ReadonlyMap<string, GgufReadValue>): string[] {
  const tokens = meta.get("tokenizer.ggml.tokens")?.value;
  const types = meta.get("tokenizer.ggml.token_type")?.value;
  if (!Array.isArray(tokens) || !Array.isArray(types)) return [];
  const CONTROL = 3;
  return tokens.filter((t, i) => types[i] === CONTROL && typeof t === "string") as string[];
}

/** Whether a request's `model` names this model. */
export function namesModel(model: ServedModel, name: string): boolean {
  return name === model.id || model.aliases.includes(name);
}
