/**
 * `identity show`: this node's id, public key and TLS certificate fingerprint, creating the
 * key and certificate on first use. `--json` prints the peer card that other nodes pass to
 * `skippy-disagg trust add`.
 */
import type { Command } from "commander";
import { loadOrCreateNodeIdentity } from "../transport/node_identity.ts";
import { resolveStateDir } from "../transport/state_dir.ts";
import { loadOrCreateTlsCertificate } from "../transport/tls.ts";

interface ShowFlags {
  stateDir?: string;
  json: boolean;
}

export function register(program: Command): void {
  const identity = program.command("identity").description(
    "this node's identity (key and TLS certificate)",
  );
  identity
    .command("show")
    .description("print node id, public key and certificate fingerprint (created on first use)")
    .option("--state-dir <dir>", "node state directory (default: $XDG_STATE_HOME/skippy-disagg)")
    .option("--json", "print the peer card as JSON (input for `trust add` on other nodes)", false)
    .action(async (flags: ShowFlags) => {
      const stateDir = resolveStateDir(flags.stateDir);
      const { identity: node, created } = await loadOrCreateNodeIdentity(stateDir);
      const { certificate } = await loadOrCreateTlsCertificate(stateDir);
      if (flags.json) {
        console.log(JSON.stringify({
          nodeId: node.nodeId,
          publicKey: node.publicKeyText,
          certificateSha256: certificate.fingerprint,
        }));
        return;
      }
      if (created) console.log(`created a new node identity in ${stateDir}`);
      console.log(`node id:      ${node.nodeId}`);
      console.log(`public key:   ${node.publicKeyText}`);
      console.log(`certificate:  sha256 ${certificate.fingerprint}`);
      console.log(`valid until:  ${certificate.notAfter.toISOString().slice(0, 10)}`);
      console.log(`state dir:    ${stateDir}`);
    });
}
