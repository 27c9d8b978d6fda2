/**
 * A bounded pool of engines (model contexts) on one loaded model: one per concurrent request.
 * When every engine is busy, `tryAcquire` says so and the caller refuses the request (a
 * reservation is rejected, a prompt waits): admission instead of allocation failure.
 */
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { readGgufFile, specFromGguf } from "../models/mod.ts";
import { type DecodeEngine, Engine, type RuntimeConfig } from "./engine.ts";
import { MtpDraft } from "../ffi/mtp.ts";

export interface PooledEngine {
  engine: Engine;
  draft: MtpDraft | null;
}

/** A session's engine on the decode side: a context of its own, or a sequence of a shared one. */
export interface PooledSession {
  engine: DecodeEngine;
  draft: MtpDraft | null;
}

/**
 * Where the decode side takes a session's engine from: `EnginePool` (a context per session) or
 * `SequencePool` (a sequence of one shared, continuously batched context: serve/batch_pool.ts).
 */
export interface SessionPool {
  readonly path: "per-session" | "batched";
  /** Sessions at once. */
  readonly capacity: number;
  /** Sessions taken and not yet given back (a released one counts until it is wiped). */
  readonly busy: number;
  /** An idle session with empty state, or null when all `capacity` are in use. */
  tryAcquire(): Promise<PooledSession | null>;
  /** Wipes the session's state and returns it; `whenFree` runs once it can be taken again. */
  release(item: PooledSession): void;
  whenFree: (() => void) | null;
}

export class EnginePool implements Disposable, SessionPool {
  readonly #free: PooledEngine[] = [];
  #created = 0;
  readonly path = "per-session";
  whenFree: (() => void) | null = null;

  private constructor(
    readonly model: LlamaModel,
    readonly config: RuntimeConfig,
    readonly sessionsMax: number,
    readonly withDraft: boolean,
  ) {}

  /** Loads the model once; contexts are created on demand up to `sessionsMax`. */
  static async open(config: RuntimeConfig, sessionsMax: number): Promise<EnginePool> {
    const lib = loadLlama({ cpuVariant: config.cpuVariant });
    // MTP layers are loaded when the model has them, unless turned off: a handoff of an MTP
    // model carries the draft context's state.
    const spec = specFromGguf(await readGgufFile(config.modelPath), config.modelPath);
    const mtp = config.mtp ?? spec.nextnLayers > 0;
    const model = await LlamaModel.load(lib, config.modelPath, {
      loadMtp: mtp,
      gpuLayers: config.gpuLayers,
      hugePages: config.hugePages !== false,
    });
    const withDraft = mtp && model.info().nLayerNextn > 0;
    return new EnginePool(model, { ...config, mtp }, sessionsMax, withDraft);
  }

  /** An idle engine with empty memory, or null when all `sessionsMax` are in use. */
  async tryAcquire(): Promise<PooledEngine | null> {
    const idle = this.#free.pop();
    if (idle) return idle;
    if (this.#created >= this.sessionsMax) return null;
    this.#created++;
    try {
      const engine = await Engine.open(this.config, this.model);
      const draft = this.withDraft ? await MtpDraft.open(engine.ctx) : null;
      return { engine, draft };
    } catch (error) {
      this.#created--;
      throw error;
    }
  }

  /** Wipes (zeroes) the engine's state and returns it to the pool. */
  release(item: PooledEngine | PooledSession): void {
    const pooled = item as PooledEngine;
    pooled.engine.ctx.clearMemory();
    pooled.draft?.ctx.clearMemory();
    pooled.engine.adoptPosition(0);
    this.#free.push(pooled);
    this.whenFree?.();
  }

  get busy(): number {
    return this.#created - this.#free.length;
  }

  get capacity(): number {
    return this.sessionsMax;
  }

  /** Frees idle contexts (their memory), keeping the model: for a worker that uses another pool. */
  trim(): void {
    for (const item of this.#free.splice(0)) {
      item.draft?.ctx.free();
      item.engine.ctx.free();
      this.#created--;
    }
  }

  [Symbol.dispose](): void {
    for (const item of this.#free.splice(0)) {
      item.draft?.ctx.free();
      item.engine.ctx.free();
    }
    this.model.free();
  }
}
