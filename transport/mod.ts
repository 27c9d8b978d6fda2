/**
 * transport/: authenticated QUIC between nodes, and everything needed to trust what arrives.
 * Reading order: README.md. This file only re-exports the public surface.
 */
export * from "./frame.ts";
export * from "./framed_stream.ts";
export * from "./channel.ts";
export * from "./state_dir.ts";
export * from "./node_identity.ts";
export * from "./tls.ts";
export * from "./trust.ts";
export * from "./auth.ts";
export * from "./capabilities.ts";
export * from "./credit.ts";
export * from "./handoff_stream.ts";
export * from "./peer.ts";
export * from "./establish.ts";
export * from "./quic.ts";
export * from "./fault_plan.ts";
export * from "./loopback.ts";
export * from "./handshake_gate.ts";
export * from "./link_probe.ts";
export * from "./loss_probe.ts";
export * from "./link_monitor.ts";
export { seededRandom } from "./_prng.ts";
export * from "./udp_buffers.ts";
