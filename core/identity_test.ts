import assert from "node:assert/strict";
import { hybridIdentity } from "./_test_fixtures.ts";
import { IdentityMismatchError } from "./errors.ts";
import {
  assertIdentityMatch,
  compareIdentity,
  contextTokensNeeded,
  EXACT_IDENTITY_FIELDS,
  identityDigest,
  type NumericalIdentity,
  PARITY_ONLY_FIELDS,
  parityVerdict,
  trunkLayerCount,
} from "./identity.ts";

Deno.test("identityDigest() is stable and ignores nCtx", async () => {
  const a = await identityDigest(hybridIdentity());
  assert.match(a, /^[0-9a-f]{64}$/);
  assert.equal(await identityDigest(hybridIdentity()), a);
  assert.equal(await identityDigest(hybridIdentity({ nCtx: 32768 })), a);
});

Deno.test("identityDigest() changes with every exact-match field", async () => {
  const base = await identityDigest(hybridIdentity());
  const changed: Partial<NumericalIdentity>[] = [
    { modelDigest: "00".repeat(32) },
    { tokenizerDigest: "00".repeat(32) },
    { architecture: "llama" },
    { family: "hybrid-moe-mtp" },
    { layerCount: 7 },
    { layerKinds: ["attention", "recurrent", "attention", "recurrent", "recurrent", "attention"] },
    { kType: "q8_0" },
    { vType: "q8_0" },
    { flashAttention: false },
    { kvUnified: false },
    { swaFull: true },
    { nUbatch: 256 },
    { threadCount: 4 },
    { cpuBackendVariant: "zen4" },
    { gpuLayers: 11 },
    { computeBackend: "CUDA" },
    { stateSchemaVersion: 1 },
    { llamaBuild: "v0.4.0+ffff" },
    { shimAbiVersion: 0 },
  ];
  assert.equal(changed.length, EXACT_IDENTITY_FIELDS.length);
  for (const c of changed) {
    assert.notEqual(await identityDigest(hybridIdentity(c)), base, Object.keys(c)[0]);
  }
});

Deno.test("compareIdentity() reports K type and thread count with both values", () => {
  const found = compareIdentity(
    hybridIdentity(),
    hybridIdentity({ kType: "q8_0", threadCount: 4 }),
  );
  assert.deepEqual(found, [
    { field: "kType", label: "K cache type", expected: '"f16"', found: '"q8_0"' },
    { field: "threadCount", label: "thread count", expected: "2", found: "4" },
  ]);
  assert.deepEqual(compareIdentity(hybridIdentity(), hybridIdentity()), []);
});

Deno.test("compareIdentity() requires the decoder's context to hold what the request needs", () => {
  const need = contextTokensNeeded({
    promptTokens: 8000,
    generateTokensMax: 512,
    draftTokensMax: 8,
  });
  assert.equal(need, 8520);
  const decoder = hybridIdentity({ nCtx: 8192 });
  const prefiller = hybridIdentity({ nCtx: 65536 });
  const mismatches = compareIdentity(prefiller, decoder, { contextTokensNeeded: need });
  assert.deepEqual(mismatches, [{
    field: "nCtx",
    label: "context size",
    expected: ">= 8520",
    found: "8192",
  }]);
  assert.deepEqual(
    compareIdentity(decoder, prefiller, { contextTokensNeeded: need, decoder: "remote" }),
    [],
  );
  // A larger decoder context than the prefiller's is fine: nCtx is not an exact field.
  assert.deepEqual(
    compareIdentity(prefiller, hybridIdentity({ nCtx: 131072 }), { contextTokensNeeded: need }),
    [],
  );
});

Deno.test("assertIdentityMatch() throws IdentityMismatchError naming every differing field", () => {
  const remote = hybridIdentity({ flashAttention: false, vType: "q8_0" });
  assert.throws(() => assertIdentityMatch(hybridIdentity(), remote), (e: unknown) => {
    assert.ok(e instanceof IdentityMismatchError);
    assert.match(e.message, /V cache type: expected "f16", found "q8_0"/);
    assert.match(e.message, /flash attention: expected true, found false/);
    assert.ok(e.hint);
    return true;
  });
});

Deno.test("model digests in mismatch messages are cut to a short prefix", () => {
  const [m] = compareIdentity(
    hybridIdentity(),
    hybridIdentity({ modelDigest: "0123456789ab".repeat(5) + "cdef" }),
  );
  assert.equal(m.field, "modelDigest");
  assert.equal(m.expected.length, 12);
  assert.equal(m.found, "0123456789ab");
});

Deno.test("compareIdentity() summarises differing per-layer kinds by runs", () => {
  const [m] = compareIdentity(
    hybridIdentity(),
    hybridIdentity({
      layerKinds: ["recurrent", "recurrent", "recurrent", "recurrent", "attention", "attention"],
    }),
  );
  assert.equal(m.field, "layerKinds");
  assert.equal(m.found, "0-3:recurrent,4-5:attention");
});

Deno.test("placement fields never take part in the comparison", () => {
  // WorkerIdentity keeps placement beside the numerical part; only the latter is compared.
  const a = {
    numerical: hybridIdentity(),
    placement: { host: "m3", port: 1, role: "prefill", nodeId: "a" },
  };
  const b = {
    numerical: hybridIdentity(),
    placement: { host: "m1", port: 2, role: "decode", nodeId: "b" },
  };
  assert.deepEqual(compareIdentity(a.numerical, b.numerical), []);
});

Deno.test("trunkLayerCount() leaves MTP blocks out", () => {
  assert.equal(trunkLayerCount({ layerKinds: ["recurrent", "attention", "moe", "mtp"] }), 3);
});

Deno.test("a different device of the same backend is accepted but parity is not claimed", async () => {
  const m3 = hybridIdentity({
    gpuLayers: 7,
    computeBackend: "Metal",
    computeDevice: "Apple M3 Ultra",
  });
  const m1 = { ...m3, computeDevice: "Apple M1 Ultra" };
  assert.deepEqual(PARITY_ONLY_FIELDS, ["computeDevice"]);
  assert.equal(await identityDigest(m1), await identityDigest(m3), "device is not in the digest");
  assert.deepEqual(compareIdentity(m3, m1), []);
  assert.doesNotThrow(() => assertIdentityMatch(m3, m1));
  const verdict = parityVerdict(m3, m1);
  assert.equal(verdict.parity, "not-claimed");
  assert.deepEqual(verdict.differingFields, ["computeDevice"]);
  assert.match(
    verdict.reason!,
    /compute device: this worker "Apple M3 Ultra", peer "Apple M1 Ultra"/,
  );
  assert.deepEqual(parityVerdict(m3, { ...m3 }), { parity: "bitwise", differingFields: [] });
});

Deno.test("parity is not claimed when the peer did not announce its device", () => {
  const own = hybridIdentity({
    gpuLayers: 7,
    computeBackend: "CUDA",
    computeDevice: "NVIDIA H200",
  });
  const { computeDevice: _, ...withoutDevice } = own;
  for (const remote of [undefined, withoutDevice]) {
    const verdict = parityVerdict(own, remote);
    assert.equal(verdict.parity, "not-claimed");
    assert.deepEqual(verdict.differingFields, ["computeDevice"]);
    assert.match(verdict.reason!, /did not announce/);
  }
});

Deno.test("another backend or GPU layer count is refused before any state moves", () => {
  const cpu = hybridIdentity();
  const cuda = hybridIdentity({
    gpuLayers: 7,
    computeBackend: "CUDA",
    computeDevice: "NVIDIA H200",
  });
  assert.deepEqual(compareIdentity(cpu, cuda).map((m) => m.field), ["gpuLayers", "computeBackend"]);
  assert.throws(
    () => assertIdentityMatch(cpu, cuda),
    (e: unknown) =>
      e instanceof IdentityMismatchError &&
      /GPU layers: expected 0, found 7; compute backend: expected "CPU", found "CUDA"/.test(
        e.message,
      ),
  );
  const fewer = { ...cuda, gpuLayers: 3 };
  assert.deepEqual(compareIdentity(cuda, fewer).map((m) => m.field), ["gpuLayers"]);
});

Deno.test("all-CPU handoffs claim bitwise parity whatever the CPU model", () => {
  const own = hybridIdentity();
  const { computeDevice: _, ...remote } = own;
  assert.deepEqual(parityVerdict(own, remote), { parity: "bitwise", differingFields: [] });
  assert.equal(parityVerdict(own, undefined).parity, "not-claimed", "unknown peer: no claim");
});
