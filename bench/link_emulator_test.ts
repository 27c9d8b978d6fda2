import assert from "node:assert/strict";
import { LinkEmulator } from "./link_emulator.ts";

/** An echo server and a client socket; returns a function that sends and awaits one echo. */
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

Deno.test("LinkEmulator delays each direction by at least the one-way delay", async () => {
  const { echo, client, target } = echoRig();
  const link = new LinkEmulator({ ...SHAPE, target, oneWayDelayMs: 30 });
  try {
    const t0 = performance.now();
    await client.send(new Uint8Array(100), { transport: "udp", ...link.endpoint });
    const [p] = await client.receive();
    const rtt = performance.now() - t0;
    assert.equal(p.length, 100);
    assert.ok(rtt >= 60, `round trip ${rtt} ms is under 2 x 30 ms`); // a lower bound: never early
    assert.equal(link.stats.forward.packets, 1);
    assert.equal(link.stats.backward.packets, 1);
  } finally {
    link.close();
    client.close();
    echo.close();
  }
});

Deno.test("LinkEmulator drops everything at loss 1 and counts it", async () => {
  const { echo, client, target } = echoRig();
  const link = new LinkEmulator({ ...SHAPE, target, lossFraction: 1 });
  try {
    for (let k = 0; k < 20; k++) {
      await client.send(new Uint8Array(100), { transport: "udp", ...link.endpoint });
    }
    // The relay handles each packet as it arrives; wait until it has seen all 20.
    for (let k = 0; k < 400 && link.stats.forward.lost < 20; k++) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assert.equal(link.stats.forward.lost, 20);
    assert.equal(link.stats.forward.packets, 0);
  } finally {
    link.close();
    client.close();
    echo.close();
  }
});

Deno.test("LinkEmulator bounds its queue: a burst beyond queueBytesMax is tail-dropped", async () => {
  const { echo, client, target } = echoRig();
  // 1 Mbit/s drains 125 bytes per ms: 50 packets of 1000 B need 400 ms, far longer than the
  // sends take, so all but the queue's 4 KB must wait and most are dropped.
  const link = new LinkEmulator({ ...SHAPE, target, rateBitsPerS: 1e6, queueBytesMax: 4000 });
  try {
    for (let k = 0; k < 50; k++) {
      await client.send(new Uint8Array(1000), { transport: "udp", ...link.endpoint });
    }
    for (
      let k = 0;
      k < 400 && link.stats.forward.packets + link.stats.forward.queueDrops < 50;
      k++
    ) {
      await new Promise((r) => setTimeout(r, 5));
    }
    const s = link.stats.forward;
    assert.equal(s.packets + s.queueDrops, 50);
    assert.ok(s.queueDrops > 0, JSON.stringify(s));
  } finally {
    link.close();
    client.close();
    echo.close();
  }
});

Deno.test("LinkEmulator refuses a rate above its stated ceiling and a bad shape", () => {
  const target = { hostname: "127.0.0.1", port: 9 };
  assert.throws(
    () => new LinkEmulator({ ...SHAPE, target, rateBitsPerS: 1e9, ceilingBitsPerS: 5e8 }),
    /over what this relay sustains/,
  );
  assert.throws(() => new LinkEmulator({ ...SHAPE, target, lossFraction: 2 }), /lossFraction/);
  assert.throws(() => new LinkEmulator({ ...SHAPE, target, queueBytesMax: 10 }), /queueBytesMax/);
});

Deno.test("LinkEmulator.reshape() raises the delay for new packets mid-run", async () => {
  const { echo, client, target } = echoRig();
  const link = new LinkEmulator({ ...SHAPE, target, oneWayDelayMs: 0 });
  const to = { transport: "udp" as const, ...link.endpoint };
  try {
    link.reshape({ oneWayDelayMs: 40 });
    const t0 = performance.now();
    await client.send(new Uint8Array(10), to);
    await client.receive();
    assert.ok(performance.now() - t0 >= 80);
    assert.throws(() => link.reshape({ lossFraction: -1 }), /lossFraction/);
  } finally {
    link.close();
    client.close();
    echo.close();
  }
});
