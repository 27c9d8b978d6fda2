import { assert, assertEquals, assertRejects, assertThrows } from "../testing/assert.ts";
import { InputFileError, UsageError } from "../core/errors.ts";
import { createEphemeralNodeIdentity } from "./node_identity.ts";
import {
  legacyRolesNotice,
  parsePeerCard,
  parseTrustRoles,
  rolesOf,
  TRUST_ROLES,
  TrustList,
} from "./trust.ts";

Deno.test("TrustList adds, lists, finds by full key, removes, and persists with mode 0600", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const [a, b] = [await createEphemeralNodeIdentity(), await createEphemeralNodeIdentity()];
    const list = await TrustList.load(dir);
    assertEquals(list.entries(), []);
    const { entry, replaced } = await list.add({ publicKey: a.publicKey, label: "prefill-1" });
    assert(!replaced);
    assertEquals(entry.nodeId, a.nodeId);
    await list.add({ publicKey: b.publicKey, certificateSha256: new Uint8Array(32).fill(1) });
    await list.save();
    assertEquals((await Deno.stat(`${dir}/trust.json`)).mode! & 0o777, 0o600);

    const loaded = await TrustList.load(dir);
    assertEquals(loaded.entries().map((e) => e.nodeId), [a.nodeId, b.nodeId]);
    assertEquals((await loaded.lookupKey(a.publicKey))?.label, "prefill-1");
    assertEquals(loaded.lookup(b.nodeId)?.certificateSha256, "01".repeat(32));
    assertEquals(loaded.remove(a.nodeId)?.nodeId, a.nodeId);
    assertEquals(await loaded.lookupKey(a.publicKey), undefined);
    assert((await loaded.add({ publicKey: b.publicKey, label: "again" })).replaced);
    assertEquals(
      loaded.lookup(b.nodeId)?.certificateSha256,
      "01".repeat(32),
      "re-adding keeps the pin",
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("TrustList.load() names the file and the fix when it is corrupt", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/trust.json`, "{not json");
    const error = await assertRejects(() => TrustList.load(dir), InputFileError, "trust.json");
    assert(error.hint?.includes("trust add"));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("parsePeerCard() reads a bare key or the identity JSON, and rejects junk", async () => {
  const a = await createEphemeralNodeIdentity();
  assertEquals(parsePeerCard(a.publicKeyText).publicKey, a.publicKey);
  const card = parsePeerCard(JSON.stringify({
    nodeId: a.nodeId,
    publicKey: a.publicKeyText,
    certificateSha256: "cd".repeat(32),
    future: true,
  }));
  assertEquals(card.certificateSha256?.[0], 0xcd);
  assertThrows(() => parsePeerCard("{"), UsageError, "not valid JSON");
  assertThrows(() => parsePeerCard("{}"), UsageError, "publicKey");
});

Deno.test("TrustList roles: recorded in order, kept on re-add, absent means every role, bad ones refused", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const [a, b] = [await createEphemeralNodeIdentity(), await createEphemeralNodeIdentity()];
    const list = await TrustList.load(dir);
    await list.add({ publicKey: a.publicKey }, ["prefill", "coordinator"]);
    await list.add({ publicKey: b.publicKey });
    await list.save();
    const loaded = await TrustList.load(dir);
    assertEquals(loaded.lookup(a.nodeId)?.roles, ["coordinator", "prefill"]);
    assertEquals([...rolesOf(loaded.lookup(a.nodeId))], ["coordinator", "prefill"]);
    assertEquals(loaded.lookup(b.nodeId)?.roles, undefined);
    assertEquals([...rolesOf(loaded.lookup(b.nodeId))], [...TRUST_ROLES], "legacy: every role");
    assertEquals(rolesOf(undefined).size, 0, "an untrusted peer has no role");
    assertEquals(loaded.legacyEntries().map((e) => e.nodeId), [b.nodeId]);
    await loaded.add({ publicKey: a.publicKey, label: "x" });
    assertEquals(loaded.lookup(a.nodeId)?.roles, ["coordinator", "prefill"], "re-add keeps roles");
    await loaded.add({ publicKey: a.publicKey }, ["decode"]);
    assertEquals(loaded.lookup(a.nodeId)?.roles, ["decode"], "roles given replace them");
    await assertRejects(() => loaded.add({ publicKey: a.publicKey }, []), UsageError, "roles");

    assertEquals(parseTrustRoles(" decode, prefill,decode "), ["prefill", "decode"]);
    assertThrows(() => parseTrustRoles("prefill,admin"), UsageError, '"admin"');
    assertThrows(() => parseTrustRoles(","), UsageError, "No roles");
    assert(legacyRolesNotice(2).includes("--roles"));

    const file = JSON.parse(await Deno.readTextFile(`${dir}/trust.json`));
    file.peers[0].roles = ["root"];
    await Deno.writeTextFile(`${dir}/trust.json`, JSON.stringify(file));
    await assertRejects(() => TrustList.load(dir), InputFileError, a.nodeId);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
