/**
 * @peculiar/x509, loaded the one way that works under Deno: its dependency tsyringe needs a
 * Reflect metadata polyfill installed before it is evaluated, and the library needs to be
 * told to use WebCrypto. Import x509 from here, never directly.
 */
import "reflect-metadata";
import * as x509 from "@peculiar/x509";

x509.cryptoProvider.set(crypto);

export { x509 };
