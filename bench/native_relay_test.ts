import assert from "node:assert/strict";
import { buildNativeRelay, measureNativeCeiling, NativeLinkRelay } from "./native_relay.ts";

const binary = await buildNativeRelay().catch(() => null);
const ignore = binary === null; // no C compiler here: the TypeScript relay's tests still run

/** An echo server and a client socket on loopback. */
function echoRig() {
  const echo = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
  (async () => {
    for (;;) {
      try {
        const [p, from] = await echo.receive();
        await echo.send(p, from);
      } catch {
        return;
      }
    }
  })();
  const client = Deno.listenDatagram({ transport: "udp", hostname: "127.0.0.1", port: 0 });
  return { echo, client, target: echo.addr as Deno.NetAddr };
}

const SHAPE = { rateBitsPerS: 100e6, oneWayDelayMs: 0, lossFraction: 0, queueBytesMax: 1 << 20 };

Deno.test({
  name: "NativeLinkRelay delays each direction by at least the one-way delay, reshaped mid-run",
  ignore,
  fn: async () => {
    const { echo, client, target } = echoRig();
    const link = await NativeLinkRelay.start(binary!, { ...SHAPE, target, oneWayDelayMs: 15 });
    const to = { transport: "udp" as const, ...link.endpoint };
    try {
      let t0 = performance.now();
      await client.send(new Uint8Array(100), to);
      const [p] = await client.receive();
      assert.equal(p.length, 100);
      assert.ok(performance.now() - t0 >= 30, "never early: 2 x 15 ms at least");
      await link.reshape({ oneWayDelayMs: 40 });
      t0 = performance.now();
      await client.send(new Uint8Array(10), to);
      await client.receive();
      assert.ok(performance.now() - t0 >= 80);
      const s = await link.stats();
      assert.equal(s.forward.delivered, 2);
      assert.equal(s.backward.delivered, 2);
      assert.ok(s.forward.lateUsMax >= 0);
      await assert.rejects(() => link.reshape({ lossFraction: -1 }), /lossFraction/);
    } finally {
      link.close();
      await link.closed();
      client.close();
      echo.close();
    }
  },
});

Deno.test({
  name: "NativeLinkRelay drops everything at loss 1 and tail-drops beyond its queue",
  ignore,
  fn: async () => {
    const { echo, client, target } = echoRig();
    const lossy = await NativeLinkRelay.start(binary!, { ...SHAPE, target, lossFraction: 1 });
    // 1 Mbit/s drains 125 B/ms: 50 packets of 1,000 B need 400 ms, far longer than the sends.
    const slow = await NativeLinkRelay.start(binary!, {
      ...SHAPE,
      target,
      rateBitsPerS: 1e6,
      queueBytesMax: 4000,
    });
    try {
      for (let k = 0; k < 50; k++) {
        await client.send(new Uint8Array(1000), { transport: "udp", ...lossy.endpoint });
        await client.send(new Uint8Array(1000), { transport: "udp", ...slow.endpoint });
      }
      // Each relay handles a datagram as it arrives; wait until each has seen all 50.
      const seen = async (l: NativeLinkRelay) => {
        const f = (await l.stats()).forward;
        return f.packets + f.lost + f.queueDrops;
      };
      for (let k = 0; k < 400 && ((await seen(lossy)) < 50 || (await seen(slow)) < 50); k++) {
        await new Promise((r) => setTimeout(r, 5));
      }
      const l = (await lossy.stats()).forward;
      assert.equal(l.lost, 50);
      assert.equal(l.packets, 0);
      const s = (await slow.stats()).forward;
      assert.equal(s.packets + s.queueDrops, 50);
      assert.ok(s.queueDrops > 0 && s.packets >= 4, JSON.stringify(s));
      assert.equal(await lossy.drops(), 50);
    } finally {
      lossy.close();
      slow.close();
      await Promise.all([lossy.closed(), slow.closed()]);
      client.close();
      echo.close();
    }
  },
});

Deno.test({
  name: "NativeLinkRelay states its ceiling and refuses a rate above it, and non-loopback targets",
  ignore,
  fn: async () => {
    const c = await measureNativeCeiling(binary!, 2000);
    assert.ok(c.bitsPerS > 0 && c.packets > 0, JSON.stringify(c));
    assert.ok(c.rttFloorUsMedian > 0);
    const target = { hostname: "127.0.0.1", port: 9 };
    await assert.rejects(
      () =>
        NativeLinkRelay.start(binary!, {
          ...SHAPE,
          target,
          rateBitsPerS: 1e9,
          ceilingBitsPerS: 5e8,
        }),
      /over what this relay sustains/,
    );
    await assert.rejects(
      () => NativeLinkRelay.start(binary!, { ...SHAPE, target: { hostname: "10.0.0.1", port: 9 } }),
      /not loopback/,
    );
  },
});
