import assert from "node:assert/strict";
import {
  readUdpBufferFacts,
  readUdpReceiveDrops,
  UDP_RECEIVE_BUFFER_BYTES_MIN,
  udpBufferAdvice,
  udpReceiveDropsFrom,
} from "./udp_buffers.ts";

const LINUX = {
  settings: { default: "net.core.rmem_default", max: "net.core.rmem_max" },
};

Deno.test("udpBufferAdvice() names the small default and the sysctl that raises it", () => {
  const advice = udpBufferAdvice({
    ...LINUX,
    receiveDefaultBytes: 212_992,
    receiveMaxBytes: 212_992,
  });
  assert.ok(advice);
  assert.match(advice, /net\.core\.rmem_default is 208 KiB \(under 4 MiB\)/);
  assert.match(
    advice,
    /sysctl -w net\.core\.rmem_max=4194304 net\.core\.rmem_default=4194304$/,
  );
  // A larger max is kept; a default at the minimum needs nothing.
  const big = udpBufferAdvice({ ...LINUX, receiveDefaultBytes: 212_992, receiveMaxBytes: 2 ** 26 });
  assert.match(big!, /rmem_max=67108864 /);
  assert.equal(
    udpBufferAdvice({
      ...LINUX,
      receiveDefaultBytes: UDP_RECEIVE_BUFFER_BYTES_MIN,
      receiveMaxBytes: UDP_RECEIVE_BUFFER_BYTES_MIN,
    }),
    null,
  );
  // macOS: the default is net.inet.udp.recvspace; kern.ipc.maxsockbuf counts overhead too.
  const mac = udpBufferAdvice({
    settings: { default: "net.inet.udp.recvspace", max: "kern.ipc.maxsockbuf" },
    receiveDefaultBytes: 786_896,
    receiveMaxBytes: 8_388_608,
  });
  assert.match(mac!, /sysctl -w kern\.ipc\.maxsockbuf=8388608 net\.inet\.udp\.recvspace=4194304$/);
});

Deno.test("udpReceiveDropsFrom() reads RcvbufErrors from /proc/net/snmp text", () => {
  const snmp = [
    "Tcp: RtoAlgorithm RtoMin",
    "Tcp: 1 200",
    "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors",
    "Udp: 23505943 6290 349263 19297566 349263 0",
    "UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors",
    "UdpLite: 0 0 0 0 7 0",
  ].join("\n");
  assert.equal(udpReceiveDropsFrom(snmp), 349_263);
  assert.equal(udpReceiveDropsFrom("Udp: InDatagrams NoPorts\nUdp: 1 2"), null);
  assert.equal(udpReceiveDropsFrom(""), null);
});

Deno.test("readUdpBufferFacts() and readUdpReceiveDrops() read this host (Linux)", {
  ignore: Deno.build.os !== "linux",
}, async () => {
  const facts = await readUdpBufferFacts();
  assert.ok(facts && facts.receiveDefaultBytes > 0 && facts.receiveMaxBytes > 0);
  assert.equal(facts.settings.default, "net.core.rmem_default");
  const drops = await readUdpReceiveDrops();
  assert.ok(drops !== null && drops >= 0);
});
