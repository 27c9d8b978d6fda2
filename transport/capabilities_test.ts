import { assert, assertEquals } from "../testing/assert.ts";
import {
  canonicalJson,
  type Capabilities,
  eligibleForHandoff,
  parseCapabilities,
} from "./capabilities.ts";

const identity = { model: "0xabc", tokenizer: "0xdef", nCtx: 4096 };
const prefill: Capabilities = {
  protocolVersion: 1,
  roles: ["prefill"],
  stateSchemaVersions: [1, 2],
  kvCodecs: ["raw"],
  kvDtypes: ["f16", "q8_0"],
  numericalIdentity: identity,
};
const decode: Capabilities = {
  ...prefill,
  roles: ["decode"],
  stateSchemaVersions: [2, 3],
  kvDtypes: ["f16"],
};

Deno.test("parseCapabilities() ignores unknown fields and roles, drops malformed ones with a note", () => {
  const { capabilities, problems } = parseCapabilities({
    protocolVersion: 1,
    roles: ["decode", "teleport"],
    kvCodecs: "raw",
    stateSchemaVersions: [1, -2, "3"],
    shinyNewField: { x: 1 },
  });
  assertEquals(capabilities, { protocolVersion: 1, roles: ["decode"], stateSchemaVersions: [1] });
  assertEquals(problems.length, 1);
  assert(problems[0].includes("kvCodecs"));
  assertEquals(parseCapabilities("nonsense").problems, ["capabilities are not a map"]);
  assertEquals(parseCapabilities({}).capabilities, {});
});

Deno.test("eligibleForHandoff() accepts matching peers and picks the highest common schema", () => {
  const verdict = eligibleForHandoff(prefill, decode, "decode");
  assertEquals(verdict, { ok: true, stateSchemaVersion: 2, kvCodecs: ["raw"], kvDtypes: ["f16"] });
  assert(eligibleForHandoff(prefill, { ...decode, roles: ["prefill+decode"] }, "decode").ok);
  const reordered = {
    ...decode,
    numericalIdentity: { nCtx: 4096, tokenizer: "0xdef", model: "0xabc" },
  };
  assert(eligibleForHandoff(prefill, reordered, "decode").ok, "key order must not matter");
});

Deno.test("eligibleForHandoff() marks an older or mismatched peer ineligible with a reason, never throws", () => {
  const cases: [Capabilities, string][] = [
    [{}, "handoff protocol version"],
    [{ ...decode, protocolVersion: 2 }, "speaks handoff protocol 2"],
    [{ ...decode, roles: ["prefill"] }, 'role "decode"'],
    [{ ...decode, stateSchemaVersions: [9] }, "no common state schema"],
    [{ ...decode, kvCodecs: ["zstd"] }, "no common KV codec"],
    [{ ...decode, kvDtypes: ["bf16"] }, "no common KV dtype"],
    [{ ...decode, numericalIdentity: undefined }, "no numerical identity"],
    [{ ...decode, numericalIdentity: { ...identity, nCtx: 8192 } }, "numerical identity differs"],
  ];
  for (const [remote, reason] of cases) {
    const verdict = eligibleForHandoff(prefill, remote, "decode");
    assert(
      !verdict.ok && verdict.reason.includes(reason),
      `${JSON.stringify(verdict)} should mention ${reason}`,
    );
  }
  const local = eligibleForHandoff({ ...prefill, roles: ["decode"] }, decode, "decode");
  assert(!local.ok && local.reason.includes('this node does not advertise role "prefill"'));
  const mismatch = eligibleForHandoff(prefill, { ...decode, numericalIdentity: "0x999" }, "decode");
  assert(
    !mismatch.ok && !mismatch.reason.includes("0x"),
    "reasons must not print identity digests",
  );
});

Deno.test("canonicalJson() sorts keys and renders bytes as hex", () => {
  assertEquals(canonicalJson({ b: 1, a: [new Uint8Array([1, 255])] }), '{"a":["0x01ff"],"b":1}');
});

Deno.test("parseCapabilities() keeps a boolean layerCapture and drops any other value with a note", () => {
  assertEquals(parseCapabilities({ layerCapture: true }).capabilities, { layerCapture: true });
  assertEquals(parseCapabilities({ layerCapture: false }).capabilities, { layerCapture: false });
  const bad = parseCapabilities({ layerCapture: "yes" });
  assertEquals(bad.capabilities, {});
  assert(bad.problems[0].includes("layerCapture"));
  const both = { layerCapture: true, lastPageCapture: true };
  assertEquals(parseCapabilities(both).capabilities, both);
  const badPage = parseCapabilities({ layerCapture: true, lastPageCapture: 1 });
  assertEquals(badPage.capabilities, { layerCapture: true });
  assert(badPage.problems[0].includes("lastPageCapture"));
});

Deno.test("parseCapabilities() keeps a known congestion controller and drops any other with a note", () => {
  for (const cc of ["cubic", "bbr", "auto"] as const) {
    assertEquals(parseCapabilities({ congestionControl: cc }).capabilities, {
      congestionControl: cc,
    });
  }
  const bad = parseCapabilities({ congestionControl: "reno" });
  assertEquals(bad.capabilities, {});
  assert(bad.problems[0].includes("congestionControl"));
});
