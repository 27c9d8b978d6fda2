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
  /** Prompt tokens as the workers will count them (BOS included when the model adds it). */
  countTokens(text: string): number;
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
      swaBytes: sizes.swaKvBytesPerToken * sizes.slidingWindow,
      mtpBytesPerToken: sizes.mtpKvBytesPerToken,
    },
    countTokens: (text) => model.vocab.tokenize(text).length,
    close: () => model.free(),
  };
}

/** Whether a request's `model` names this model. */
export function namesModel(model: ServedModel, name: string): boolean {
  return name === model.id || model.aliases.includes(name);
}
