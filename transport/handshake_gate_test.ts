import { assert, assertEquals } from "../testing/assert.ts";
import { HandshakeGate, sourceOfAddress } from "./handshake_gate.ts";

Deno.test("sourceOfAddress() drops the port of IPv4 and IPv6 addresses", () => {
  assertEquals(sourceOfAddress("10.0.0.7:4433"), "10.0.0.7");
  assertEquals(sourceOfAddress("[::1]:4433"), "::1");
  assertEquals(sourceOfAddress("[fe80::1]"), "fe80::1");
  assertEquals(sourceOfAddress("loopback:client"), "loopback");
  assertEquals(sourceOfAddress("::1"), "::1");
});

Deno.test("HandshakeGate evicts within a source at its per-source bound, never another source", () => {
  const gate = new HandshakeGate({ handshakesInFlightMax: 100, handshakesPerSourceMax: 3 });
  const evicted: string[] = [];
  const other = gate.admit("10.0.0.2", () => evicted.push("other"));
  const flood = [0, 1, 2, 3, 4].map((i) => gate.admit("10.0.0.1", () => evicted.push(`flood${i}`)));
  assertEquals(evicted, ["flood0", "flood1"]);
  assertEquals(gate.inFlightFrom("10.0.0.1"), 3);
  assertEquals(gate.inFlightFrom("10.0.0.2"), 1);
  assert(!other.evicted && flood[0].evicted && !flood[4].evicted);
});

Deno.test("HandshakeGate at its total bound evicts the least advanced handshake, not a newer step", () => {
  const gate = new HandshakeGate({ handshakesInFlightMax: 3, handshakesPerSourceMax: 3 });
  const evicted: string[] = [];
  const trusted = gate.admit("a", () => evicted.push("trusted"));
  const stalled1 = gate.admit("a", () => evicted.push("stalled1"));
  const stalled2 = gate.admit("a", () => evicted.push("stalled2"));
  trusted.progress(); // its ClientHello arrived: it is now ahead of both stalled ones
  gate.admit("a", () => evicted.push("new1"));
  assertEquals(evicted, ["stalled1"]);
  gate.admit("a", () => evicted.push("new2"));
  assertEquals(evicted, ["stalled1", "stalled2"]);
  // Only stage-0 newcomers are behind the trusted one now: they go first.
  gate.admit("a", () => evicted.push("new3"));
  assertEquals(evicted, ["stalled1", "stalled2", "new1"]);
  assert(!trusted.evicted && stalled1.evicted && stalled2.evicted);
  assertEquals(gate.evictedTotal, 3);
});

Deno.test("HandshakeGate frees a slot on release and ignores a second release", () => {
  const gate = new HandshakeGate({ handshakesInFlightMax: 2, handshakesPerSourceMax: 2 });
  let evictions = 0;
  const a = gate.admit("s", () => evictions++);
  gate.admit("s", () => evictions++);
  a.release();
  a.release();
  assertEquals(gate.inFlight, 1);
  gate.admit("s", () => evictions++);
  assertEquals(evictions, 0);
  assertEquals(gate.inFlight, 2);
  gate.admit("s", () => evictions++);
  assertEquals(evictions, 1);
  assertEquals(gate.inFlight, 2);
});
