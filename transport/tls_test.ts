import { assert, assertEquals, assertThrows } from "../testing/assert.ts";
import { UsageError } from "../core/errors.ts";
import { x509 } from "./_x509.ts";
import { loadOrCreateTlsCertificate, parseFingerprint } from "./tls.ts";

Deno.test("loadOrCreateTlsCertificate() makes a CA:FALSE P-256 leaf once and keeps its fingerprint", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const first = await loadOrCreateTlsCertificate(dir, {
      hostnames: ["10.1.2.3", "node-a.example"],
    });
    assert(first.created);
    assertEquals((await Deno.stat(`${dir}/tls-key.pem`)).mode! & 0o777, 0o600);
    const again = await loadOrCreateTlsCertificate(dir, { hostnames: ["other-host"] });
    assert(!again.created);
    assertEquals(again.certificate.fingerprint, first.certificate.fingerprint);
    assertEquals(first.certificate.fingerprint.length, 64);

    const cert = new x509.X509Certificate(first.certificate.certPem);
    assertEquals(cert.getExtension(x509.BasicConstraintsExtension)?.ca, false);
    assertEquals((cert.publicKey.algorithm as EcKeyAlgorithm).namedCurve, "P-256");
    const names = cert.getExtension(x509.SubjectAlternativeNameExtension)!.names.toJSON().map((n) =>
      n.value
    );
    for (const name of ["localhost", "127.0.0.1", "10.1.2.3", "node-a.example"]) {
      assert(names.includes(name), name);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("parseFingerprint() accepts hex with colons or a sha256: prefix, nothing else", () => {
  const hex = "ab".repeat(32);
  assertEquals(parseFingerprint(hex).length, 32);
  assertEquals(parseFingerprint(`sha256:${hex.toUpperCase()}`)[0], 0xab);
  assertEquals(parseFingerprint(hex.match(/../g)!.join(":"))[31], 0xab);
  assertThrows(() => parseFingerprint("abcd"), UsageError, "Invalid certificate fingerprint");
});
