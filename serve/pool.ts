/**
 * A bounded pool of engines (model contexts) on one loaded model: one per concurrent request.
 * When every engine is busy, `tryAcquire` says so and the caller refuses the request (a
 * reservation is rejected, a prompt waits): admission instead of allocation failure.
 */
import { LlamaModel, loadLlama } from "../ffi/mod.ts";
import { readGgufFile, specFromGguf } from "../models/mod.ts";
import { Engine, type RuntimeConfig } from "./engine.ts";
import { MtpDraft } from "../ffi/mtp.ts";

export interface PooledEngine {
  engine: Engine;
  draft: MtpDraft | null;
}

export class EnginePool implements Disposable {
  readonly #free: PooledEngine[] = [];
  #created = 0;

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
  release(item: PooledEngine): void {
    item.engine.ctx.clearMemory();
    item.draft?.ctx.clearMemory();
    item.engine.adoptPosition(0);
    this.#free.push(item);
  }

  get busy(): number {
    return this.#created - this.#free.length;
  }

  [Symbol.dispose](): void {
    for (const item of this.#free.splice(0)) {
      item.draft?.ctx.free();
      item.engine.ctx.free();
    }
    this.model.free();
  }
}
