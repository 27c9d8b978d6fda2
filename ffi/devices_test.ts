import assert from "node:assert/strict";
import { UsageError } from "../core/errors.ts";
import { testModel } from "../testing/models.ts";
import { gpuLayersParam, listDevices, offloadDevices, resolveOffload } from "./devices.ts";
import { loadLlama } from "./library.ts";
import { LlamaModel } from "./model.ts";

Deno.test("listDevices() reports ggml's devices with a backend, a type and a name", () => {
  const devices = listDevices(loadLlama());
  assert.ok(devices.length >= 1, "the CPU backend registers at least one device");
  const cpu = devices.find((d) => d.type === "cpu");
  assert.ok(cpu, `a CPU device among ${devices.map((d) => d.name).join(", ")}`);
  assert.equal(cpu.backend, "CPU");
  assert.ok(cpu.name.length > 0);
  for (const d of devices) assert.notEqual(d.type, "unknown", d.name);
});

Deno.test("offloadDevices() prefers dedicated GPUs and falls back to integrated ones", () => {
  const cpu = { name: "CPU", description: "x", type: "cpu", backend: "CPU" } as const;
  const igpu = { name: "V0", description: "iGPU", type: "igpu", backend: "Vulkan" } as const;
  const gpu = { name: "CUDA0", description: "NVIDIA H200", type: "gpu", backend: "CUDA" } as const;
  assert.deepEqual(offloadDevices([cpu]), []);
  assert.deepEqual(offloadDevices([cpu, igpu]), [igpu]);
  assert.deepEqual(offloadDevices([cpu, igpu, gpu]), [gpu]);
});

Deno.test("GPU offload follows the build: auto and all offload every layer, or none on CPU", async () => {
  const lib = loadLlama();
  const hasGpu = offloadDevices(listDevices(lib)).length > 0;
  using model = await LlamaModel.load(lib, await testModel("hybrid"), { gpuLayers: "all" });
  const nLayer = model.info().nLayer;
  if (hasGpu) {
    assert.equal(gpuLayersParam(lib, "auto"), -1);
    assert.equal(model.offload.gpuLayers, nLayer + 1);
    assert.notEqual(model.offload.backend, "CPU");
    assert.equal(resolveOffload(lib, 3, nLayer, 3).gpuLayers, 3);
  } else {
    assert.equal(gpuLayersParam(lib, "auto"), 0);
    assert.equal(gpuLayersParam(lib, "all"), 0);
    assert.deepEqual(
      { gpuLayers: model.offload.gpuLayers, backend: model.offload.backend },
      { gpuLayers: 0, backend: "CPU" },
    );
    assert.match(model.offload.fallback ?? "", /no GPU device/);
    assert.throws(() => gpuLayersParam(lib, 4), (e: unknown) => e instanceof UsageError);
    assert.equal(resolveOffload(lib, 0, nLayer, 0).fallback, undefined, "0 asked, 0 given");
  }
});
