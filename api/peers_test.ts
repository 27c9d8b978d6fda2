import assert from "node:assert/strict";
import { parsePeers, PeerSet, watchPeers } from "./peers.ts";

const file = (workers: unknown[]) => JSON.stringify({ workers });
const P = { address: "127.0.0.1:7702", nodeId: "p1", role: "prefill" };
const D1 = { address: "127.0.0.1:7701", nodeId: "d1", role: "decode" };
const D2 = { address: "[::1]:7703", nodeId: "d2", role: "decode" };

Deno.test("parsePeers reads workers and names the bad field", () => {
  const w = parsePeers(file([P, D1, D2]));
  assert.deepEqual(w[2], { peer: { nodeId: "d2", host: "::1", port: 7703 }, role: "decode" });
  assert.equal(parsePeers(JSON.stringify([D1])).length, 1);
  assert.throws(() => parsePeers(file([{ ...D1, role: "boss" }])), /field "workers.0.role"/);
  assert.throws(() => parsePeers(file([{ ...D1, address: "nohost" }])), /workers.0.address/);
  assert.throws(() => parsePeers("{"), /not JSON/);
});

Deno.test("PeerSet.pick takes the least-loaded decode and prefill workers", () => {
  const set = new PeerSet(parsePeers(file([P, D1, D2])));
  const first = set.pick()!;
  assert.equal(first.decode.peer.nodeId, "d1");
  assert.equal(first.prefill?.peer.nodeId, "p1");
  const release = set.hold([first.decode, first.prefill]);
  assert.equal(set.pick()!.decode.peer.nodeId, "d2");
  release();
  release(); // idempotent
  assert.equal(set.pick()!.decode.peer.nodeId, "d1");
  assert.equal(new PeerSet(parsePeers(file([P]))).pick(), null);
  assert.equal(new PeerSet(parsePeers(file([D1]))).pick()!.prefill, null);
});

Deno.test("watchPeers re-reads the file when it changes and keeps the last good list", async () => {
  const dir = await Deno.makeTempDir();
  const path = `${dir}/peers.json`;
  await Deno.writeTextFile(path, file([D1]));
  const lines: string[] = [];
  const watch = await watchPeers(path, null, { pollMs: 100, log: (l) => lines.push(l) });
  try {
    assert.equal(watch.set.workers.length, 1);
    await Deno.writeTextFile(path, file([P, D1]));
    await Deno.utime(path, new Date(), new Date(Date.now() + 5_000));
    const count = () => watch.set.workers.length;
    while (count() !== 2) await new Promise((r) => setTimeout(r, 20));
    await Deno.writeTextFile(path, "{broken");
    await Deno.utime(path, new Date(), new Date(Date.now() + 10_000));
    while (!lines.some((l) => l.includes("keeping the last peers list"))) {
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(watch.set.workers.length, 2);
  } finally {
    watch.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
