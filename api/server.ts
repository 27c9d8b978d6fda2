/**
 * The API server: the served model, admission, the request log and the Hono app, on
 * `Deno.serve`. `coordinate` (cli/coordinate.ts) and the tests start it the same way.
 */
import type { Node } from "../serve/node.ts";
import { Admission, type AdmissionOptions } from "./admission.ts";
import { createApp } from "./app.ts";
import type { ApiKeys } from "./keys.ts";
import { openServedModel, type ServedModel } from "./model.ts";
import type { PeerSet } from "./peers.ts";
import type { PlacementMode } from "./placement.ts";
import type { LivePlacement } from "./live_placement.ts";
import { ApiService } from "./service.ts";
import { RequestLog } from "./telemetry.ts";

export interface ApiServerOptions {
  hostname: string;
  /** 0: any free port. */
  port: number;
  /** The coordinator's node (its identity and trust list reach the workers). */
  node: Node;
  /** The GGUF the workers serve (read for its vocabulary, template and sizes). */
  modelPath: string;
  /** The workers' context size in tokens (`serve --ctx`). */
  nCtx: number;
  peers: PeerSet;
  placement: PlacementMode;
  admission?: Partial<AdmissionOptions>;
  /** Null: unauthenticated, one tenant. */
  keys: ApiKeys | null;
  /** Where each request's telemetry line goes (besides the ring), or null. */
  telemetry?: ((line: string) => Promise<void>) | null;
  /** A request fails when no worker reports progress for this long, in ms. */
  workerIdleTimeoutMs: number;
  promptTokensMin?: number;
  /** `auto` placement over live facts (api/live_placement.ts); null: the no-link rule. */
  live?: LivePlacement | null;
}

export interface ApiServer {
  url: string;
  service: ApiService;
  model: ServedModel;
  close(): Promise<void>;
}

export async function startApiServer(o: ApiServerOptions): Promise<ApiServer> {
  const model = await openServedModel(o.modelPath, o.nCtx);
  const service = new ApiService({
    node: o.node,
    model,
    peers: o.peers,
    placement: o.placement,
    admission: new Admission(o.admission),
    log: new RequestLog(o.telemetry ?? null),
    workerIdleTimeoutMs: o.workerIdleTimeoutMs,
    promptTokensMin: o.promptTokensMin,
    live: o.live ?? null,
  });
  const app = createApp(service, o.keys);
  const server = Deno.serve(
    { hostname: o.hostname, port: o.port, onListen: () => {} },
    app.fetch,
  );
  const addr = server.addr as Deno.NetAddr;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  return {
    url: `http://${host}:${addr.port}`,
    service,
    model,
    close: async () => {
      // Running requests end now (their workers free them); shutdown then waits for nothing.
      service.abortAll();
      await server.shutdown();
      model.close();
    },
  };
}
