import { assert, assertEquals, assertRejects, assertThrows } from "../testing/assert.ts";
import { InputFileError, UsageError } from "../core/errors.ts";
import {
  createEphemeralNodeIdentity,
  loadOrCreateNodeIdentity,
  nodeIdOf,
  parsePublicKey,
  signAsNode,
  verifyNodeSignature,
} from "./node_identity.ts";

Deno.test("loadOrCreateNodeIdentity() creates a 0600 key once and reloads the same node id", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const first = await loadOrCreateNodeIdentity(`${dir}/state`);
    assert(first.created);
    assertEquals((await Deno.stat(`${dir}/state/node-key.jwk`)).mode! & 0o777, 0o600);
    const again = await loadOrCreateNodeIdentity(`${dir}/state`);
    assert(!again.created);
    assertEquals(again.identity.nodeId, first.identity.nodeId);
    assertEquals(again.identity.publicKeyText, first.identity.publicKeyText);
    assertEquals(first.identity.nodeId.length, 16);
    assert(/^[a-z2-7]+$/.test(first.identity.nodeId));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("loadOrCreateNodeIdentity() refuses a key file other users can read", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await loadOrCreateNodeIdentity(dir);
    await Deno.chmod(`${dir}/node-key.jwk`, 0o644);
    const error = await assertRejects(
      () => loadOrCreateNodeIdentity(dir),
      InputFileError,
      "accessible by other users",
    );
    assert(error.hint?.includes("chmod 600"));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("node signatures verify only for the same key and message", async () => {
  const [a, b] = [await createEphemeralNodeIdentity(), await createEphemeralNodeIdentity()];
  const message = new TextEncoder().encode("transcript");
  const signature = await signAsNode(a, message);
  assert(await verifyNodeSignature(a.publicKey, signature, message));
  assert(!await verifyNodeSignature(b.publicKey, signature, message));
  assert(!await verifyNodeSignature(a.publicKey, signature, new TextEncoder().encode("other")));
  assert(!await verifyNodeSignature(a.publicKey, signature.subarray(1), message));
});

Deno.test("parsePublicKey() round-trips the text form and rejects junk with a hint", async () => {
  const a = await createEphemeralNodeIdentity();
  assertEquals(parsePublicKey(a.publicKeyText), a.publicKey);
  assertEquals(await nodeIdOf(parsePublicKey(a.publicKeyText.slice("ed25519:".length))), a.nodeId);
  const error = assertThrows(() => parsePublicKey("ed25519:tooshort"), UsageError);
  assert(error.hint?.includes("identity show"));
});
