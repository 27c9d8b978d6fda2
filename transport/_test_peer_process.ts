/**
 * A QUIC server in its own process, for tests that must kill a peer for real (SIGKILL): an
 * in-process "kill" would still answer keep-alives. Protocol with the test, one JSON line
 * each way: it prints `{ port, certificateSha256, publicKey }`, reads the client's
 * `{ publicKey }`, trusts it, accepts one peer and then idles until killed.
 *
 * Usage: deno run -A --unstable-net transport/_test_peer_process.ts <maxIdleTimeoutMs>
 */
import { createEphemeralNodeIdentity, parsePublicKey } from "./node_identity.ts";
import { listenQuic } from "./quic.ts";
import { createEphemeralTlsCertificate } from "./tls.ts";
import { TrustList } from "./trust.ts";

const maxIdleTimeoutMs = Number(Deno.args[0] ?? 2000);
const identity = await createEphemeralNodeIdentity();
const certificate = await createEphemeralTlsCertificate();
const trust = TrustList.inMemory();
const listener = listenQuic({
  certificate,
  identity,
  trust,
  maxIdleTimeoutMs,
  capabilities: { roles: ["decode"] },
});
console.log(JSON.stringify({
  port: listener.addr.port,
  certificateSha256: certificate.fingerprint,
  publicKey: identity.publicKeyText,
}));
const lines = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
const { value } = await lines.read();
await trust.add({ publicKey: parsePublicKey(JSON.parse(value!).publicKey) });
const peer = await listener.accept();
await peer?.receive(); // idles here until killed
