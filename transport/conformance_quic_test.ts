/** The conformance suite against the real QUIC transport on 127.0.0.1 (cases and assertions: _conformance.ts). */
import {
  conformanceCases,
  makeTestNodes,
  type TestNodes,
  type TransportHarness,
} from "./_conformance.ts";
import { type FaultPlan, withFaults } from "./fault_plan.ts";
import { establishPeer } from "./establish.ts";
import type { PeerOptions } from "./peer.ts";
import { connectQuic, connectQuicRaw, listenQuicRaw } from "./quic.ts";
import { createEphemeralTlsCertificate, parseFingerprint } from "./tls.ts";
import { parsePublicKey } from "./node_identity.ts";

/** Client and server PeerConnections over QUIC, faults applied to the chosen sender's raw connection. */
async function quicPair(
  nodes: TestNodes,
  faults?: FaultPlan,
  client?: Partial<PeerOptions>,
  server?: Partial<PeerOptions>,
) {
  const certificate = await createEphemeralTlsCertificate();
  const listener = listenQuicRaw({ certificate });
  const faulty = (
    side: "client" | "server",
  ) => (faults && (faults.sender ?? "client") === side ? faults : undefined);
  const serverSide = listener.accept().then((raw) => {
    const plan = faulty("server");
    return establishPeer(plan ? withFaults(raw!, plan) : raw!, "server", {
      ...nodes.server,
      ...server,
    });
  });
  serverSide.catch(() => {});
  const raw = await connectQuicRaw({
    hostname: "127.0.0.1",
    port: listener.addr.port,
    serverCertificateSha256: certificate.sha256,
  });
  const plan = faulty("client");
  const clientSide = establishPeer(plan ? withFaults(raw, plan) : raw, "client", {
    ...nodes.client,
    ...client,
  });
  clientSide.catch(() => {});
  return { listener, clientSide, serverSide };
}

const quic: TransportHarness = {
  name: "quic",
  async pair(nodes, options = {}) {
    const { listener, clientSide, serverSide } = await quicPair(
      nodes,
      options.faults,
      options.client,
      options.server,
    );
    const [client, server] = [await clientSide, await serverSide];
    return {
      client,
      server,
      cleanup: async () => {
        await client.close();
        listener.close();
      },
    };
  },
  async attempt(nodes) {
    const { listener, clientSide, serverSide } = await quicPair(nodes);
    const [client, server] = await Promise.allSettled([clientSide, serverSide]);
    return {
      clientError: client.status === "rejected" ? client.reason : null,
      serverError: server.status === "rejected" ? server.reason : null,
      cleanup: async () => {
        if (client.status === "fulfilled") await client.value.close();
        listener.close();
      },
    };
  },
  async killablePair(idleTimeoutMs) {
    const nodes = await makeTestNodes();
    const process = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--unstable-net",
        new URL("./_test_peer_process.ts", import.meta.url).pathname,
        String(idleTimeoutMs),
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const lines = process.stdout.pipeThrough(new TextDecoderStream()).getReader();
    const server = JSON.parse((await lines.read()).value!);
    const stdin = process.stdin.getWriter();
    await stdin.write(
      new TextEncoder().encode(
        JSON.stringify({ publicKey: nodes.client.identity.publicKeyText }) + "\n",
      ),
    );
    await nodes.client.trust.add({ publicKey: parsePublicKey(server.publicKey) });
    const client = await connectQuic({
      ...nodes.client,
      hostname: "127.0.0.1",
      port: server.port,
      serverCertificateSha256: parseFingerprint(server.certificateSha256),
      maxIdleTimeoutMs: idleTimeoutMs,
    });
    let killed = false;
    const kill = async () => {
      if (killed) return;
      killed = true;
      process.kill("SIGKILL");
      await process.status;
    };
    return {
      client,
      kill,
      cleanup: async () => {
        await kill();
        await stdin.close().catch(() => {});
        await lines.cancel().catch(() => {});
        await client.close();
      },
    };
  },
};

conformanceCases(quic);
