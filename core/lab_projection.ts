/**
 * The lab projection: M3 Ultra prefiller, M1 Ultra decoder, Nemotron 3 Super Q4, links of
 * 1/10/16/25/40/100 Gbit/s. State sizes come from the model config (8,192 B/token of F16 KV,
 * 172,687,360 B recurrent, the `lab-state` preset measured at runtime); the rates and link
 * efficiency are PLACEHOLDERS until `bench calibrate` runs on the lab machines, and every
 * printed row says so. A calibration file replaces them.
 *
 * @module
 */
import type { NodeRates } from "./node_rates.ts";
import { type PlacementRequest, placeRequest } from "./placement.ts";
import { LinkEstimator } from "./link_estimates.ts";
import type { Placement } from "./planner.ts";
import type { CertificationFile } from "./certification.ts";

/** A projection input with where it came from. */
export interface Sourced<T> {
  value: T;
  source: string;
}

export const LAB_LINK_GBITS = [1, 10, 16, 25, 40, 100] as const;
export const LAB_PROMPT_TOKENS = [2048, 8192, 32768, 131072] as const;

const PLACEHOLDER = "placeholder (not measured; replace with `bench calibrate` on the lab machine)";

/** The projection's inputs, printed with their sources. */
export const LAB_INPUTS = {
  kvBytesPerToken: {
    value: 8192,
    source: "model config: 8 attention layers x K,V x 2 KV heads x 128 dims x 2 B (F16)",
  },
  recurrentBytes: {
    value: 172_687_360,
    source: "runtime export of the lab-state preset (Super's 40 Mamba layers, conv + SSM)",
  },
  prefiller: {
    value: {
      nodeId: "m3-ultra",
      source: "placeholder",
      sourceNote: PLACEHOLDER,
      prefill: [{ contextTokens: 0, tokensPerS: 600 }, { contextTokens: 131072, tokensPerS: 400 }],
      decode: [{ contextTokens: 0, tokensPerS: 45 }],
    } as NodeRates,
    source: PLACEHOLDER,
  },
  decoder: {
    value: {
      nodeId: "m1-ultra",
      source: "placeholder",
      sourceNote: PLACEHOLDER,
      prefill: [{ contextTokens: 0, tokensPerS: 250 }, { contextTokens: 131072, tokensPerS: 170 }],
      decode: [{ contextTokens: 0, tokensPerS: 35 }, { contextTokens: 131072, tokensPerS: 28 }],
    } as NodeRates,
    source: PLACEHOLDER,
  },
  linkEfficiency: { value: 0.8, source: `${PLACEHOLDER}: share of the line rate QUIC achieves` },
  rttMs: { value: 0.2, source: PLACEHOLDER },
  decoderFreeBytes: {
    value: 40 * 2 ** 30,
    source: "M1 Ultra 128 GB minus a ~70 GB Q4 model and OS (estimate)",
  },
  chunkTokens: { value: 2048, source: "default prefill chunk" },
} as const;

export interface LabProjectionRow {
  linkGbit: number;
  promptTokens: number;
  placement: Placement;
  ttftColocatedMs: number;
  ttftDisaggregatedMs: number;
  commitTailMs: number;
  benefitMs: number;
  /** Reason codes other than "chosen". */
  refusals: string[];
}

/**
 * Every link x prompt point of the projection. The family counts as certified here (the
 * projection asks what the economics say); live placement still reads the file.
 */
export function labProjection(
  rates: { prefiller: NodeRates; decoder: NodeRates } = {
    prefiller: LAB_INPUTS.prefiller.value,
    decoder: LAB_INPUTS.decoder.value,
  },
): LabProjectionRow[] {
  const rows: LabProjectionRow[] = [];
  const cert: CertificationFile = {
    version: 1,
    entries: [{
      family: "hybrid-moe-mtp",
      llamaBuild: "projection",
      gate: "state-handoff",
      cases: 1,
      promptTokens: [],
      certifiedAt: "",
    }],
  };
  for (const gbit of LAB_LINK_GBITS) {
    const links = new LinkEstimator();
    const pair = { from: rates.prefiller.nodeId, to: rates.decoder.nodeId };
    const bytesPerS = (gbit * 1e9 / 8) * LAB_INPUTS.linkEfficiency.value;
    links.recordRtt(pair, LAB_INPUTS.rttMs.value, 0);
    links.recordTransfer(pair, 1e9, 1e12 / bytesPerS, 0, "manual");
    for (const promptTokens of LAB_PROMPT_TOKENS) {
      const r: PlacementRequest = {
        promptTokens,
        prefiller: { nodeId: pair.from, rates: rates.prefiller, hasRole: true },
        decoder: {
          nodeId: pair.to,
          rates: rates.decoder,
          hasRole: true,
          freeBytes: LAB_INPUTS.decoderFreeBytes.value,
        },
        schemaShared: true,
        identityMatch: true,
        family: "hybrid-moe-mtp",
        llamaBuild: "projection",
        state: {
          kvBytesPerToken: LAB_INPUTS.kvBytesPerToken.value,
          recurrentBytes: LAB_INPUTS.recurrentBytes.value,
        },
        chunkTokens: LAB_INPUTS.chunkTokens.value,
      };
      const d = placeRequest(r, { links, nowMs: 1, certification: cert });
      const e = d.estimates!;
      rows.push({
        linkGbit: gbit,
        promptTokens,
        placement: d.placement,
        ttftColocatedMs: d.prediction!.ttftColocatedMs,
        ttftDisaggregatedMs: d.prediction!.ttftDisaggregatedMs,
        commitTailMs: d.prediction!.commitTailMs,
        benefitMs: e.benefitMs,
        refusals: d.reasons.filter((x) => x.code !== "chosen").map((x) => x.code),
      });
    }
  }
  return rows;
}
