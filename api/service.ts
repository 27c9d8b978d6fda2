/**
 * One API request, from a prompt to text: count its tokens against the context, wait for
 * admission, pick workers and a placement, run it through `runHandoff`, cut stop sequences
 * (and cancel the request on the workers once one matches), and record metrics and telemetry.
 * Endpoints (app.ts) only shape what goes in and comes out.
 */
import type { TokenLogprob } from "../core/logprobs.ts";
import { HandoffAbortedError, WorkerBusyError } from "../core/mod.ts";
import { runHandoff } from "../serve/coordinator.ts";
import { PROMPT_BYTES_MAX } from "../serve/messages.ts";
import type { HandoffRequest, HandoffResult } from "../serve/coordinator.ts";
import type { Node } from "../serve/node.ts";
import { Admission, type Ticket } from "./admission.ts";
import { ApiError, contextTooSmall, serverError } from "./errors.ts";
import { ApiMetrics } from "./metrics.ts";
import type { ChatFormat } from "./chat.ts";
import type { ServedModel } from "./model.ts";
import type { PeerSet, WorkerEntry } from "./peers.ts";
import type { LivePlacement } from "./live_placement.ts";
import { decidePlacement, type PlacementDecision, type PlacementMode } from "./placement.ts";
import type { GenerationParams } from "./schemas.ts";
import { RequestOutput } from "./request_output.ts";
import { registerWorkerMetrics, type WorkerMetricsOptions } from "./worker_metrics.ts";
import { type RequestLog, type RequestRecord } from "./telemetry.ts";
import { failureReason, finishRecord } from "./_outcome.ts";

/** The workers a request was given (`PeerSet.pick`). */
type Picked = NonNullable<ReturnType<PeerSet["pick"]>>;

export interface ServiceOptions {
  node: Node;
  model: ServedModel;
  peers: PeerSet;
  placement: PlacementMode;
  admission: Admission;
  log: RequestLog;
  /** A request fails when no worker reports progress for this long, in ms. */
  workerIdleTimeoutMs: number;
  /** Passed to the planner (`auto` placement). */
  promptTokensMin?: number;
  /** `auto` over live link estimates, rates and certification (absent: the no-link rule). */
  live?: LivePlacement | null;
  /** Bounds of the worker-side gauges' stats requests. */
  workerMetrics?: Partial<WorkerMetricsOptions>;
}

export interface RunInput {
  endpoint: RequestRecord["endpoint"];
  params: GenerationParams;
  prompt: string;
  /** Chat: the template's special-token markers in `prompt` (api/template_markers.ts). */
  promptSpecialSpans?: number[];
  tenantId: string;
  /** Aborts when the client goes away. */
  signal: AbortSignal;
  /** Echoed in the response and telemetry (default: a fresh UUID). */
  requestId?: string;
  /** Chat: which path rendered the prompt (echoed in the response). */
  chatFormat?: ChatFormat;
  /** Chat: where the template's user turns end (the prefill worker checkpoints there). */
  turnEnds?: number[];
  /** Streaming: each piece of text that is safe to send (stop sequences cut). */
  onDelta?: (text: string) => void;
}

export interface RunOutput {
  requestId: string;
  created: number;
  text: string;
  finishReason: "stop" | "length";
  promptTokens: number;
  /** Prompt tokens restored from the prefill worker's prefix cache (0: none computed there). */
  cachedTokens: number;
  completionTokens: number;
  placement: "disaggregated" | "colocated";
  plannedPlacement: PlacementDecision;
  fallbackReason: string | null;
  chatFormat: ChatFormat | null;
  /**
   * With `logprobs`: each generated token (as far as the client got it, a stop sequence's
   * batch included, like completionTokens) and its log probabilities (null where no worker
   * had its logits). Null without `logprobs`.
   */
  logprobs: { tokens: number[]; logprobs: (TokenLogprob | null)[] } | null;
}

/** completions: OpenAI's default of 16; chat: the rest of the context (llama-server's). */
function defaultMaxTokens(endpoint: RunInput["endpoint"], room: number): number {
  return endpoint === "completions" ? Math.min(16, room) : room;
}

export class ApiService {
  readonly metrics: ApiMetrics;
  /** Aborted by `abortAll`, when the server stops. */
  #closing = new AbortController();
  /**
   * The last loss probe counted per prefill -> decode pair (its id): one entry per configured
   * pair, feeding both /metrics and live placement.
   */
  readonly #lossProbes = new Map<string, number>();

  constructor(readonly options: ServiceOptions) {
    this.metrics = new ApiMetrics({
      running: () => options.admission.running,
      waiting: () => options.admission.waiting,
    });
    registerWorkerMetrics(
      this.metrics.registry,
      options.node,
      options.peers,
      options.workerMetrics,
    );
  }

  /** Ends every request (waiting or running) as if its client went away: the server stops. */
  abortAll(): void {
    this.#closing.abort();
  }

  /** Runs one request: `admit`, then its `run`. */
  async run(input: RunInput): Promise<RunOutput> {
    return await (await this.admit(input)).run();
  }

  /**
   * The checks that come before any response byte (prompt size, context, admission), so a
   * stream can still answer them with their own HTTP status; then `run()` (exactly once)
   * runs the admitted request and frees its slot.
   */
  async admit(request: RunInput): Promise<{ run: () => Promise<RunOutput> }> {
    const o = this.options;
    const input = { ...request, signal: AbortSignal.any([request.signal, this.#closing.signal]) };
    // TTFT and e2e are the client's: from arrival, queue time included (as vLLM's).
    const t0 = performance.now();
    const requestId = input.requestId ?? crypto.randomUUID();
    const promptBytes = new TextEncoder().encode(input.prompt).length;
    if (promptBytes > PROMPT_BYTES_MAX) {
      throw new ApiError(
        400,
        "invalid_request_error",
        `The prompt is ${promptBytes} bytes, over the ${PROMPT_BYTES_MAX} the workers accept`,
        { code: "prompt_too_large", param: "prompt" },
      );
    }
    const promptTokens = o.model.countTokens(input.prompt, input.promptSpecialSpans);
    const room = o.model.nCtx - promptTokens;
    const maxTokens = input.params.maxTokens ?? defaultMaxTokens(input.endpoint, room);
    if (maxTokens < 1 || promptTokens + maxTokens > o.model.nCtx) {
      throw contextTooSmall(promptTokens, Math.max(1, maxTokens), o.model.nCtx);
    }
    const ticket = await o.admission.acquire(input.signal);
    const record: RequestRecord = {
      time: "",
      requestId,
      handoffId: null,
      endpoint: input.endpoint,
      tenantId: input.tenantId,
      status: 200,
      finishReason: "error",
      plannedPlacement: null,
      placementReason: null,
      placement: null,
      fallbackReason: null,
      error: null,
      promptTokens,
      generatedTokens: 0,
      queueMs: ticket.queueMs,
      ttftMs: null,
      tpotMs: null,
      e2eMs: null,
      handoff: null,
      linkLoss: null,
    };
    this.metrics.queue.observe(ticket.queueMs / 1000);
    return { run: () => this.#runAndRecord(input, record, ticket, maxTokens, t0) };
  }

  async #runAndRecord(
    input: RunInput,
    record: RequestRecord,
    ticket: Ticket,
    maxTokens: number,
    t0: number,
  ): Promise<RunOutput> {
    const o = this.options;
    try {
      return await this.#runAdmitted(input, record, maxTokens, t0);
    } catch (error) {
      const api = error instanceof ApiError ? error : serverError(error);
      record.status = input.signal.aborted ? 499 : api.status;
      record.finishReason = input.signal.aborted ? "abort" : "error";
      record.error = input.signal.aborted ? "the client went away" : api.message;
      if (input.signal.aborted) this.metrics.success.inc({ finished_reason: "abort" });
      else if (error instanceof WorkerBusyError) this.metrics.busyRefusals.inc();
      else this.metrics.failures.inc({ reason: failureReason(error) });
      throw api;
    } finally {
      ticket.release();
      record.time = new Date().toISOString();
      record.e2eMs = performance.now() - t0;
      await o.log.add(record).catch(() => {});
    }
  }

  async #runAdmitted(
    input: RunInput,
    record: RequestRecord,
    maxTokens: number,
    t0: number,
  ): Promise<RunOutput> {
    const o = this.options;
    const picked = o.peers.pick();
    if (!picked) {
      throw new ApiError(503, "unavailable_error", "No decode worker is configured", {
        code: "no_worker",
        retryAfterS: o.admission.options.retryAfterS,
      });
    }
    const planned = await this.#plan(record.promptTokens, picked);
    record.plannedPlacement = planned.placement;
    record.placementReason = planned.reason;
    const handoffId = crypto.randomUUID();
    record.handoffId = handoffId;
    const out = new RequestOutput(input, this.#timingObserver(record), t0);
    const request = this.#request(input, picked, planned, maxTokens, handoffId, out);
    const result = await this.#runOnWorkers(input, picked, planned, request, out);
    out.flush();
    const generated = out.generated;
    const finishReason = out.stopped || generated < maxTokens ? "stop" : "length";
    const placement = result?.placement ?? planned.placement;
    // A fallback is a planned handoff that ran colocated; a colocated plan is not one.
    const fallbackReason = planned.placement === "disaggregated"
      ? result?.fallbackReason ?? null
      : null;
    finishRecord(this.metrics, record, {
      result,
      placement,
      fallbackReason,
      generated,
      finishReason,
      t0,
    });
    this.#recordPrediction(record, planned, picked);
    this.#learnFromOutcome(result, picked, planned);
    return {
      requestId: record.requestId,
      created: Math.floor(Date.now() / 1000),
      text: out.collected,
      finishReason,
      promptTokens: record.promptTokens,
      cachedTokens: result?.placement === "disaggregated" ? result.telemetry.cachedTokens : 0,
      completionTokens: generated,
      placement,
      plannedPlacement: planned,
      fallbackReason,
      chatFormat: input.chatFormat ?? null,
      logprobs: out.logprobs,
    };
  }

  /** Each token arrival's timing: the first is the request's TTFT, later ones its gaps. */
  #timingObserver(record: RequestRecord): RequestOutput["onTiming"] {
    return (ttftMs, gapMs, tokens) => {
      if (ttftMs !== null) {
        record.ttftMs = ttftMs;
        this.metrics.ttft.observe(ttftMs / 1000);
      } else {
        for (let i = 0; i < tokens; i++) this.metrics.itl.observe(gapMs / 1000 / tokens);
      }
    };
  }

  /**
   * `runHandoff` with the picked workers held for its duration; null when a stop sequence
   * cancelled the request on the workers, which is a normal end.
   */
  async #runOnWorkers(
    input: RunInput,
    picked: Picked,
    planned: PlacementDecision,
    request: HandoffRequest,
    out: RequestOutput,
  ): Promise<HandoffResult | null> {
    const release = this.options.peers.hold([
      picked.decode,
      planned.placement === "colocated" ? null : picked.prefill,
    ]);
    try {
      return await runHandoff(this.options.node, request);
    } catch (error) {
      // A stop sequence cancelled the request on the workers: that is a normal end.
      if (!(out.stopped && !input.signal.aborted && error instanceof HandoffAbortedError)) {
        throw error;
      }
      return null;
    } finally {
      release();
    }
  }

  /**
   * What an outcome teaches /metrics and live placement: the prefill worker's newest loss
   * probe of the pair's link (once per probe) and, for live placement, the handoff itself.
   */
  #learnFromOutcome(
    result: HandoffResult | null,
    picked: Picked,
    planned: PlacementDecision,
  ): void {
    const o = this.options;
    const loss = result?.linkLoss;
    if (loss && picked.prefill) {
      const pair = { from: picked.prefill.peer.nodeId, to: picked.decode.peer.nodeId };
      // Outcomes repeat the prefill worker's newest probe until its next: each counts once.
      const key = `${pair.from}>${pair.to}`;
      if (this.#lossProbes.get(key) !== loss.probe) {
        this.#lossProbes.set(key, loss.probe);
        this.metrics.observeLinkLoss(pair.from, pair.to, loss);
        o.live?.recordLinkLoss(pair, loss);
      }
    }
    if (result && o.live) {
      o.live.record(
        result,
        picked.prefill?.peer.nodeId ?? null,
        picked.decode.peer.nodeId,
        planned.prediction?.linkMs ?? null,
      );
    }
  }

  /** What the workers are asked to run for one admitted request. */
  #request(
    input: RunInput,
    picked: Picked,
    planned: PlacementDecision,
    maxTokens: number,
    handoffId: string,
    out: RequestOutput,
  ): HandoffRequest {
    return {
      prefill: (picked.prefill ?? picked.decode).peer,
      decode: picked.decode.peer,
      colocated: planned.placement === "colocated",
      prompt: input.prompt,
      promptSpecialSpans: input.promptSpecialSpans,
      ...(input.turnEnds?.length ? { turnEnds: input.turnEnds } : {}),
      generateTokens: maxTokens,
      sampling: {
        temperature: input.params.temperature,
        topK: input.params.topK,
        topP: input.params.topP,
        seed: input.params.seed ?? crypto.getRandomValues(new Uint32Array(1))[0],
      },
      tenantId: input.tenantId,
      probe: false,
      timeoutMs: this.options.workerIdleTimeoutMs,
      handoffId,
      signal: AbortSignal.any([input.signal, out.stopper.signal]),
      ...(input.params.logprobs !== null ? { logprobs: input.params.logprobs } : {}),
      onTokens: (tokens, lps) => out.tokens(tokens, lps),
      onText: (piece) => out.text(piece),
    };
  }

  /** Where the request runs: the live planner under `--placement auto`, else the no-link rule. */
  async #plan(promptTokens: number, picked: Picked): Promise<PlacementDecision> {
    const o = this.options;
    const linkOf = (w: WorkerEntry | null) =>
      w ? o.node.links.get(w.peer).catch(() => null) : Promise.resolve(null);
    const common = {
      promptTokens,
      state: o.model.state,
      family: o.model.family,
      hasPrefillWorker: picked.prefill !== null,
    };
    return o.placement === "auto" && o.live
      ? o.live.decide({
        ...common,
        prefill: await linkOf(picked.prefill),
        decode: await linkOf(picked.decode),
      })
      : decidePlacement({ ...common, mode: o.placement, promptTokensMin: o.promptTokensMin });
  }

  /**
   * The handoff record's prediction beside its measurement (null: the placement was not
   * planned on costs), and its link facts: the RTT the handoff measured itself (its
   * reservation round trip), else the live estimate placement used; bandwidth only from that
   * estimate (null without auto placement, or before the pair's first handoff: nothing
   * measured it).
   */
  #recordPrediction(record: RequestRecord, planned: PlacementDecision, picked: Picked): void {
    if (!record.handoff) return;
    const o = this.options;
    const p = planned.prediction;
    const est = o.live && picked.prefill
      ? o.live.pairs.estimate(
        { from: picked.prefill.peer.nodeId, to: picked.decode.peer.nodeId },
        performance.now(),
      )
      : null;
    record.handoff = {
      ...record.handoff,
      bandwidthBytesPerS: record.handoff.bandwidthBytesPerS ?? est?.bandwidthBytesPerS ?? null,
      rttMs: record.handoff.rttMs ?? est?.rttMs ?? null,
      prediction: p ? { placement: planned.placement, ...p } : null,
    };
  }
}
