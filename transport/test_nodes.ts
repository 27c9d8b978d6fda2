/**
 * Two test nodes that trust each other (or, when told, do not): ephemeral identities, in-memory
 * trust lists and capabilities. For tests here and in the folders above transport/ that need a
 * connected pair (serve/link_loss_test.ts); never used outside tests.
 */
import type { PeerOptions } from "./peer.ts";
import { createEphemeralNodeIdentity, type NodeIdentity } from "./node_identity.ts";
import { TrustList } from "./trust.ts";

/** Two nodes with identities, trust lists and capabilities. */
export interface TestNodes {
  client: PeerOptions & { identity: NodeIdentity };
  server: PeerOptions & { identity: NodeIdentity };
}

/** Makes two nodes; each trusts the other unless told otherwise. */
export async function makeTestNodes(
  trust: { client?: boolean; server?: boolean } = {},
): Promise<TestNodes> {
  const [clientIdentity, serverIdentity] = [
    await createEphemeralNodeIdentity(),
    await createEphemeralNodeIdentity(),
  ];
  const [clientTrust, serverTrust] = [TrustList.inMemory(), TrustList.inMemory()];
  if (trust.client ?? true) {
    await clientTrust.add({ publicKey: serverIdentity.publicKey, label: "server" });
  }
  if (trust.server ?? true) {
    await serverTrust.add({ publicKey: clientIdentity.publicKey, label: "client" });
  }
  return {
    client: {
      identity: clientIdentity,
      trust: clientTrust,
      capabilities: { protocolVersion: 1, roles: ["prefill"] },
    },
    server: {
      identity: serverIdentity,
      trust: serverTrust,
      capabilities: { protocolVersion: 1, roles: ["decode"] },
    },
  };
}
