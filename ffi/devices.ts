/**
 * The compute devices the loaded llama.cpp build can use, through ggml's backend device API
 * (`ggml_backend_dev_count` / `_get` / `_type` / `_name` / `_description`), and how many layers
 * a model load offloads to them.
 *
 * A GPU build (CUDA, Vulkan, Metal) registers GPU devices once its backend plug-in is loaded;
 * the CPU-only packages register the CPU device only, so offload resolves to 0 layers there.
 */
import { UsageError } from "../core/errors.ts";
import { type LlamaLibrary, readCString } from "./library.ts";
import { GGML_BACKEND_DEVICE_TYPE } from "./llama.ts";

export type DeviceType = typeof GGML_BACKEND_DEVICE_TYPE[number] | "unknown";

/** One ggml backend device. Names only; nothing content-derived. */
export interface BackendDevice {
  /** ggml's device name, e.g. "CUDA0", "MTL0", "CPU". */
  readonly name: string;
  /** Human description, e.g. "NVIDIA H200", "Apple M3 Ultra". */
  readonly description: string;
  readonly type: DeviceType;
  /** The backend that registered it, e.g. "CUDA", "Metal", "Vulkan", "CPU". */
  readonly backend: string;
}

/** Every device ggml has registered, in registry order. */
export function listDevices(lib: LlamaLibrary): BackendDevice[] {
  const count = Number(lib.ggmlRegistry.ggml_backend_dev_count());
  const out: BackendDevice[] = [];
  for (let i = 0; i < count; i++) {
    const dev = lib.ggmlRegistry.ggml_backend_dev_get(BigInt(i));
    if (dev === null) continue;
    const g = lib.ggml;
    const reg = g.ggml_backend_dev_backend_reg(dev);
    out.push({
      name: readCString(g.ggml_backend_dev_name(dev)),
      description: readCString(g.ggml_backend_dev_description(dev)),
      type: GGML_BACKEND_DEVICE_TYPE[g.ggml_backend_dev_type(dev)] ?? "unknown",
      backend: reg === null ? "" : readCString(g.ggml_backend_reg_name(reg)),
    });
  }
  return out;
}

/**
 * Devices llama.cpp offloads layers to by default: dedicated GPUs, or the integrated ones when
 * there is no dedicated GPU (llama.cpp's own rule when `llama_model_params.devices` is NULL).
 */
export function offloadDevices(devices: readonly BackendDevice[]): BackendDevice[] {
  const gpus = devices.filter((d) => d.type === "gpu");
  return gpus.length > 0 ? gpus : devices.filter((d) => d.type === "igpu");
}

/** `--gpu-layers`: a count, `"all"`, or `"auto"` (all when a GPU device exists, else 0). */
export type GpuLayersRequest = number | "all" | "auto";

/** Where a loaded model's layers run. Backend and layer count decide numerics and layout. */
export interface Offload {
  /** Layers offloaded (llama.cpp counts the output layer as one more: at most n_layer + 1). */
  readonly gpuLayers: number;
  /** "CPU" when nothing is offloaded, else the GPU backend ("CUDA", "Metal", "Vulkan"). */
  readonly backend: string;
  /** The offload devices' descriptions joined by ", " ("CPU" when nothing is offloaded). */
  readonly device: string;
  /** Set when offload was asked for (or defaulted) but resolved to the CPU: why. */
  readonly fallback?: string;
}

export const CPU_OFFLOAD: Offload = { gpuLayers: 0, backend: "CPU", device: "CPU" };

/**
 * The `n_gpu_layers` to pass for `request`, before the model is loaded: -1 (llama.cpp's "all")
 * or a count. An explicit count above 0 without a GPU device is a `UsageError`.
 */
export function gpuLayersParam(lib: LlamaLibrary, request: GpuLayersRequest = "auto"): number {
  const gpus = offloadDevices(listDevices(lib));
  if (gpus.length === 0) {
    if (typeof request === "number" && request > 0) {
      throw new UsageError(
        `--gpu-layers ${request} needs a GPU, but this llama.cpp build has no GPU device`,
        { hint: "use --gpu-layers 0, or install a GPU build (see scripts/gpu-check.sh)" },
      );
    }
    return 0;
  }
  return typeof request === "number" ? request : -1;
}

/** What `nGpuLayers` (as passed to the load) amounts to for a model of `nLayer` layers. */
export function resolveOffload(
  lib: LlamaLibrary,
  nGpuLayers: number,
  nLayer: number,
  request: GpuLayersRequest = "auto",
): Offload {
  const gpus = offloadDevices(listDevices(lib));
  if (gpus.length === 0) {
    return request === 0 ? CPU_OFFLOAD : {
      ...CPU_OFFLOAD,
      fallback: "no GPU device in this llama.cpp build (CPU-only package)",
    };
  }
  const layers = nGpuLayers < 0 ? nLayer + 1 : Math.min(nGpuLayers, nLayer + 1);
  if (layers === 0) return CPU_OFFLOAD;
  return {
    gpuLayers: layers,
    backend: [...new Set(gpus.map((d) => d.backend))].join("+"),
    device: gpus.map((d) => d.description || d.name).join(", "),
  };
}
