/**
 * Safe wrapper for a loaded model (`llama_model`). Disposable: `using model = await
 * LlamaModel.load(...)` frees it at the end of the scope.
 */
import { InputFileError, ModelLoadError } from "../core/errors.ts";
import { cString, type LlamaLibrary, readCString } from "./library.ts";
import { LLAMA_LOAD_MODE, llama_model_params } from "./llama.ts";
import { Vocab } from "./vocab.ts";
import { adviseNewMappings, hugePagesUnavailable, mallocHugePages } from "./huge_pages.ts";
import { gpuLayersParam, type GpuLayersRequest, type Offload, resolveOffload } from "./devices.ts";

export interface ModelLoadOptions {
  /** Load the MTP (nextn) layers so an MTP draft context can be created. */
  loadMtp?: boolean;
  /** Memory-map the file (default true). */
  mmap?: boolean;
  /**
   * Layers to offload to the GPU (`n_gpu_layers`): a count, "all", or "auto" (the default:
   * all when the build has a GPU device, else 0). Offload changes numerics.
   */
  gpuLayers?: GpuLayersRequest;
  /** Load only the vocabulary (no weights): for tokenizing where no compute runs. */
  vocabOnly?: boolean;
  /**
   * Where the kernel has huge pages (Linux, THP `madvise` or `always`): read the weights into
   * memory instead of mapping the file, so that they sit in huge pages: from their first touch
   * where malloc asks for them (`mallocHugePages`), else advised and collapsed once read
   * (`adviseNewMappings`). Each process then holds its own copy rather than sharing the page
   * cache; the bytes, and numerics, are the same. Elsewhere, or with `mmap: true`, the file is
   * mapped as usual. Default false.
   */
  hugePages?: boolean;
}

/** Static facts about a loaded model, as llama.cpp reports them. */
export interface ModelInfo {
  architecture: string;
  description: string;
  nLayer: number;
  nLayerNextn: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  nSwa: number;
  nCtxTrain: number;
  nVocab: number;
  nParams: number;
  sizeBytes: number;
  isRecurrent: boolean;
  isHybrid: boolean;
}

const GGUF_MAGIC = "GGUF";

export class LlamaModel implements Disposable {
  #ptr: Deno.PointerValue;
  readonly vocab: Vocab;
  readonly path: string;
  readonly loadMtp: boolean;
  /** Where the layers run: GPU layer count, backend and device (part of the identity). */
  readonly offload: Offload;
  /** The weights were read into huge-page memory (see `ModelLoadOptions.hugePages`). */
  weightsInHugePages = false;

  private constructor(
    readonly lib: LlamaLibrary,
    ptr: Deno.PointerObject,
    path: string,
    loadMtp: boolean,
    offload: (nLayer: number) => Offload,
  ) {
    this.#ptr = ptr;
    this.path = path;
    this.loadMtp = loadMtp;
    this.vocab = new Vocab(lib, lib.symbols.llama_model_get_vocab(ptr)!);
    this.offload = offload(lib.symbols.llama_model_n_layer(ptr));
  }

  /** Loads a GGUF model; throws InputFileError / ModelLoadError with what went wrong. */
  static async load(
    lib: LlamaLibrary,
    path: string,
    options: ModelLoadOptions = {},
  ): Promise<LlamaModel> {
    checkGgufFile(path);
    const params = lib.symbols.llama_model_default_params();
    const nGpuLayers = gpuLayersParam(lib, options.gpuLayers);
    llama_model_params.set(params, "n_gpu_layers", nGpuLayers);
    const huge = options.hugePages === true && options.mmap !== true && !options.vocabOnly &&
      hugePagesUnavailable() === null;
    // Where malloc does not ask for huge pages itself, the weights it read are advised after.
    const advise = huge && !mallocHugePages() ? adviseNewMappings(true) : null;
    llama_model_params.set(
      params,
      "load_mode",
      options.mmap === false || huge ? LLAMA_LOAD_MODE.NONE : LLAMA_LOAD_MODE.MMAP,
    );
    llama_model_params.set(params, "load_mtp", options.loadMtp ?? false);
    llama_model_params.set(params, "vocab_only", options.vocabOnly ?? false);
    lib.log.clear();
    const ptr = await lib.symbols.llama_model_load_from_file(cString(path), params);
    if (ptr === null) throw loadFailure(lib, path);
    const model = new LlamaModel(
      lib,
      ptr,
      path,
      options.loadMtp ?? false,
      (nLayer) => resolveOffload(lib, nGpuLayers, nLayer, options.gpuLayers),
    );
    const advice = await advise?.();
    model.weightsInHugePages = huge && (advice === undefined || advice.collapsedBytes > 0);
    return model;
  }

  /** The native pointer; throws after dispose. */
  get ptr(): Deno.PointerObject {
    if (this.#ptr === null) throw new Error("Internal error: model used after free");
    return this.#ptr;
  }

  /** A GGUF metadata value as a string, or null when absent. */
  meta(key: string): string | null {
    const buf = new Uint8Array(4096);
    const n = this.lib.symbols.llama_model_meta_val_str(this.ptr, cString(key), buf, 4096n);
    if (n < 0) return null;
    return new TextDecoder().decode(buf.subarray(0, Math.min(n, 4095)));
  }

  info(): ModelInfo {
    const s = this.lib.symbols;
    const p = this.ptr;
    const desc = new Uint8Array(256);
    const n = s.llama_model_desc(p, desc, 256n);
    return {
      architecture: this.meta("general.architecture") ?? "unknown",
      description: new TextDecoder().decode(desc.subarray(0, Math.max(0, Math.min(n, 255)))),
      nLayer: s.llama_model_n_layer(p),
      nLayerNextn: s.llama_model_n_layer_nextn(p),
      nEmbd: s.llama_model_n_embd(p),
      nHead: s.llama_model_n_head(p),
      nHeadKv: s.llama_model_n_head_kv(p),
      nSwa: s.llama_model_n_swa(p),
      nCtxTrain: s.llama_model_n_ctx_train(p),
      nVocab: this.vocab.nTokens,
      nParams: Number(s.llama_model_n_params(p)),
      sizeBytes: Number(s.llama_model_size(p)),
      isRecurrent: s.llama_model_is_recurrent(p),
      isHybrid: s.llama_model_is_hybrid(p),
    };
  }

  free(): void {
    if (this.#ptr !== null) {
      this.lib.symbols.llama_model_free(this.#ptr);
      this.#ptr = null;
    }
  }

  [Symbol.dispose](): void {
    this.free();
  }
}

/** Cheap checks before handing a path to llama.cpp, so common mistakes get a clear message. */
export function checkGgufFile(path: string): void {
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(path, { read: true });
  } catch (cause) {
    if (cause instanceof Deno.errors.NotFound) {
      throw new InputFileError(`Model file "${path}" does not exist`, {
        hint: "check the path, or make a test model with `skippy-disagg model make`",
      });
    }
    throw new InputFileError(`Cannot open model file "${path}"`, { cause });
  }
  try {
    if (file.statSync().isDirectory) {
      throw new InputFileError(`Model path "${path}" is a directory, not a GGUF file`);
    }
    const head = new Uint8Array(8);
    const n = file.readSync(head) ?? 0;
    const magic = new TextDecoder().decode(head.subarray(0, 4));
    if (n < 8 || magic !== GGUF_MAGIC) {
      throw new InputFileError(`"${path}" is not a GGUF file (it does not start with "GGUF")`, {
        hint: "pass a .gguf model file",
      });
    }
  } finally {
    file.close();
  }
}

function loadFailure(lib: LlamaLibrary, path: string): ModelLoadError {
  const lines = lib.log.recent();
  const arch = lines.map((l) => /unknown model architecture: '([^']*)'/.exec(l)).find((m) => m);
  if (arch) {
    return new ModelLoadError(
      `Model "${path}" has an architecture this llama.cpp does not support ("${arch[1]}")`,
      { hint: "use a GGUF of an architecture supported by llama.cpp " + lib.release },
    );
  }
  const reason = lines.filter((l) => !l.startsWith("llama_model_load_from_file")).at(-1) ??
    "no reason given";
  return new ModelLoadError(`llama.cpp could not load "${path}": ${reason}`, {
    hint: "the file may be truncated or corrupt; re-create or re-download it",
  });
}

/** Reads a C string owned by llama.cpp (re-exported for the wrapper's users). */
export { readCString };
