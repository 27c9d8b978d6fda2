/**
 * `plan`: what placement the planner would choose for one request over a given link, term by
 * term (`plan --model M --prompt-tokens N --link 10G --rtt 0.2`), and the lab projection
 * (`plan --projection lab`). Rates are inputs (flags or a calibration file), never constants;
 * the projection's placeholders are printed with their sources.
 */
import { type Command, InvalidArgumentError, Option } from "commander";
import { UsageError } from "../core/errors.ts";
import { type CertificationFile, parseCertification } from "../core/certification.ts";
import { LAB_INPUTS, labProjection } from "../core/lab_projection.ts";
import { LinkEstimator } from "../core/link_estimates.ts";
import { type NodeRates, parseCalibration } from "../core/node_rates.ts";
import { explainPlan, formatPlanTerms } from "../core/plan_explain.ts";
import { type PlacementRequest, placeRequest, planInputFor } from "../core/placement.ts";
import { CONGESTION_CONTROLS, type CongestionControl } from "../core/planner.ts";
import { llamaBuild as buildOf, loadLlama } from "../ffi/mod.ts";
import { CHUNK_TOKENS_MAX, RUNTIME_DEFAULTS } from "../serve/engine.ts";
import { familyOf } from "../serve/identity.ts";
import { modelInfo } from "./_model_info.ts";
import { intArg, numberArg } from "./_options.ts";
import { defaultCertificationPath } from "./_certify.ts";

interface PlanFlags {
  model?: string;
  promptTokens?: number;
  link?: number;
  rtt?: number;
  loss: number;
  congestionControl: CongestionControl;
  prefillerRate?: number;
  decoderRate?: number;
  decodeStepRate?: number;
  calibration?: string;
  prefiller: string;
  decoder: string;
  certification?: string;
  chunkTokens: number;
  decoderFreeGib: number;
  queueMs: number;
  projection?: string;
  json: boolean;
}

/** Parses a link rate in bits/s: `10G`, `400M`, `1.5Gbit`, `2.5e9`. */
export function parseLinkRate(value: string): number {
  const m = /^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgt]?)(?:bit|bps|b)?(?:\/s)?\s*$/i.exec(value);
  const scale: Record<string, number> = { "": 1, k: 1e3, m: 1e6, g: 1e9, t: 1e12 };
  const bits = m ? Number(m[1]) * scale[m[2].toLowerCase()] : NaN;
  if (!(bits >= 1e6 && bits <= 1e13)) {
    throw new InvalidArgumentError(
      `expected a link rate like 10G or 400M (bits/s, 1M to 10T), got "${value}"`,
    );
  }
  return bits;
}

export function register(program: Command): void {
  program
    .command("plan")
    .description(
      "explain the placement the planner chooses for a request over a link, term by term",
    )
    .option("--model <gguf>", "model whose state sizes and family to plan with")
    .option("--prompt-tokens <n>", "prompt length", intArg(1, 1 << 22))
    .option("--link <rate>", "link rate in bits/s (10G, 400M)", parseLinkRate)
    .option("--rtt <ms>", "round-trip time", numberArg(0, 10_000))
    .option("--loss <p>", "packet loss fraction (0.001 = 0.1%)", numberArg(0, 1), 0)
    .addOption(
      new Option(
        "--congestion-control <cubic|bbr>",
        "the prefill worker's controller (serve --congestion-control): under loss Cubic moves " +
          "the state at the loss-limited rate, BBR at the link's",
      ).choices(CONGESTION_CONTROLS).default("cubic"),
    )
    .option("--prefiller-rate <tok/s>", "prefiller's prefill rate", numberArg(0.001, 1e7))
    .option(
      "--decoder-rate <tok/s>",
      "decoder's own prefill rate (recompute)",
      numberArg(0.001, 1e7),
    )
    .option(
      "--decode-step-rate <tok/s>",
      "decoder's decode rate (the probe step)",
      numberArg(0.001, 1e7),
    )
    .option("--calibration <file>", "rates from a calibration file (`bench calibrate`)")
    .option("--prefiller <node-id>", "prefiller's node id in the calibration file", "prefill")
    .option("--decoder <node-id>", "decoder's node id in the calibration file", "decode")
    .option("--certification <file>", "certification file (default: cache, if present)")
    .option(
      "--chunk-tokens <n>",
      "tokens per prefill chunk / KV page (the runtime's default)",
      intArg(1, CHUNK_TOKENS_MAX),
      RUNTIME_DEFAULTS.chunkTokens,
    )
    .option("--decoder-free-gib <n>", "decoder's free memory", numberArg(0, 1 << 20), 64)
    .option("--queue-ms <ms>", "prefiller queue wait (contention)", numberArg(0, 1e9), 0)
    .addOption(new Option("--projection <name>", "print a projection instead").choices(["lab"]))
    .option("--json", "print one JSON object", false)
    .action(async (flags: PlanFlags) => {
      if (flags.projection === "lab") return printLabProjection(flags.json);
      await runPlan(flags);
    });
}

async function runPlan(f: PlanFlags): Promise<void> {
  _requireLinkFlags(f);
  const info = await modelInfo(f.model!, "f16");
  const family = familyOf(info.spec);
  let llamaBuild = "unknown";
  try {
    llamaBuild = buildOf(loadLlama());
  } catch { /* no library: nothing can be certified; the verdict says so */ }
  const { prefiller, decoder } = await _rates(f);
  const links = new LinkEstimator();
  const pair = { from: prefiller.nodeId, to: decoder.nodeId };
  // The stated link becomes one RTT sample, one bulk sample and the stated loss.
  links.recordRtt(pair, f.rtt!, 0);
  links.recordTransfer(pair, 1e9, (1e9 / (f.link! / 8)) * 1000, 0, "manual");
  links.recordStatedLoss(pair, f.loss, 0);
  const s = info.state;
  const request: PlacementRequest = {
    promptTokens: f.promptTokens!,
    prefiller: { nodeId: pair.from, rates: prefiller, hasRole: true, queueMs: f.queueMs },
    decoder: {
      nodeId: pair.to,
      rates: decoder,
      hasRole: true,
      freeBytes: f.decoderFreeGib * 2 ** 30,
    },
    schemaShared: true,
    identityMatch: true,
    family,
    llamaBuild,
    state: {
      kvBytesPerToken: s.kvBytesPerToken,
      recurrentBytes: s.recurrentBytes,
      recurrentLayers: s.layers.recurrent,
      swaBytes: s.swaKvBytesPerToken * s.slidingWindow,
      mtpBytesPerToken: s.mtpKvBytesPerToken,
    },
    chunkTokens: f.chunkTokens,
    congestionControl: f.congestionControl,
  };
  const cert = await _certification(f.certification);
  const decision = placeRequest(request, { links, nowMs: 0, certification: cert.file });
  const terms = explainPlan(planInputFor(request, decision.link, cert.file), decision);
  if (f.json) {
    const model = f.model;
    console.log(
      JSON.stringify({ model, family, llamaBuild, certification: cert.path, ...decision, terms }),
    );
    return;
  }
  console.log(
    `plan: ${f.model} (${family}), llama.cpp ${llamaBuild}; certification: ${cert.path ?? "none"}`,
  );
  console.log(
    `rates: prefiller ${decision.rateSources.prefiller}, decoder ${decision.rateSources.decoder}`,
  );
  for (const line of formatPlanTerms(terms)) console.log(line);
  console.log(`decision: ${decision.placement}`);
}

/** A plan over a stated link needs the model, the prompt and the link; each missing one is named. */
function _requireLinkFlags(f: PlanFlags): void {
  const missing = (["model", "promptTokens", "link", "rtt"] as const).filter((k) =>
    f[k] === undefined
  );
  if (missing.length === 0) return;
  const flags = missing.map((k) => `--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`);
  throw new UsageError(`plan needs ${flags.join(", ")}`, {
    hint: "or run `plan --projection lab`",
  });
}

async function _rates(f: PlanFlags): Promise<{ prefiller: NodeRates; decoder: NodeRates }> {
  if (f.calibration) {
    const nodes = parseCalibration(
      JSON.parse(await Deno.readTextFile(f.calibration)),
      f.calibration,
    );
    const pick = (id: string) => {
      const n = nodes.find((x) => x.nodeId === id);
      if (!n) {
        throw new UsageError(`Calibration file ${f.calibration} has no node "${id}"`, {
          hint: `nodes: ${nodes.map((x) => x.nodeId).join(", ")}; pick with --prefiller/--decoder`,
        });
      }
      return n;
    };
    return { prefiller: pick(f.prefiller), decoder: pick(f.decoder) };
  }
  if (f.prefillerRate === undefined || f.decoderRate === undefined) {
    throw new UsageError(
      "plan needs rates: --calibration <file>, or --prefiller-rate and --decoder-rate",
      {
        hint: "the planner never assumes a node's speed",
      },
    );
  }
  const one = (tps: number) => [{ contextTokens: 0, tokensPerS: tps }];
  const step = one(f.decodeStepRate ?? 1e7);
  return {
    prefiller: {
      nodeId: "prefill",
      source: "measured",
      sourceNote: "--prefiller-rate",
      prefill: one(f.prefillerRate),
      decode: step,
    },
    decoder: {
      nodeId: "decode",
      source: "measured",
      sourceNote: "--decoder-rate",
      prefill: one(f.decoderRate),
      decode: step,
    },
  };
}

/** The certification file named, or the default one if present. */
export async function _certification(
  path?: string,
): Promise<{ file: CertificationFile | null; path: string | null }> {
  const p = path ?? defaultCertificationPath();
  try {
    return { file: parseCertification(JSON.parse(await Deno.readTextFile(p)), p), path: p };
  } catch (error) {
    if (error instanceof Deno.errors.NotFound && path === undefined) {
      return { file: null, path: null };
    }
    if (error instanceof Deno.errors.NotFound) {
      throw new UsageError(`Certification file ${p} does not exist`);
    }
    throw error;
  }
}

function printLabProjection(json: boolean): void {
  const rows = labProjection();
  if (json) {
    console.log(
      JSON.stringify({
        projection: "lab",
        label: "PROJECTION, not a measurement",
        inputs: LAB_INPUTS,
        rows,
      }),
    );
    return;
  }
  console.log(
    "PROJECTION (not a measurement): M3 Ultra prefill -> M1 Ultra decode, Nemotron 3 Super Q4",
  );
  for (const [name, v] of Object.entries(LAB_INPUTS)) {
    const value = typeof v.value === "object"
      ? JSON.stringify({ prefill: v.value.prefill, decode: v.value.decode })
      : v.value;
    console.log(`  ${name}: ${value}  [${v.source}]`);
  }
  console.log(
    "link     prompt  placement      TTFT coloc  TTFT disagg   tail(commit)     benefit  refused by",
  );
  for (const r of rows) {
    const s = (ms: number) =>
      (Math.abs(ms) >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(0)} ms`).padStart(11);
    console.log(
      `${`${r.linkGbit}G`.padEnd(6)} ${String(r.promptTokens).padStart(8)}  ${
        r.placement.padEnd(13)
      }` +
        `${s(r.ttftColocatedMs)}  ${s(r.ttftDisaggregatedMs)}  ${s(r.commitTailMs)}  ${
          s(r.benefitMs)
        }  ${r.refusals.join(",")}`,
    );
  }
}
