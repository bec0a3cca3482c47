/**
 * A start made of named steps, each leaving what undoes it on one stack: kind's
 * `pkg/cluster/internal/create/create.go` (`actionsToRun`, one action per part of the cluster)
 * with the undo kind leaves to `kind delete`. The world's start (scripts/system/system.ts) and
 * the node's (scripts/node/node.ts) are each a list of such steps; a failed or aborted start and
 * a later stop run the same stack in reverse, so a new part of the world is one more step.
 */
import { firstLine } from './wait.ts';

/** Stops or removes what a step started. */
export type Undo = () => Promise<void> | void;

/** Options of {@link Steps}. */
export interface StepsOptions {
  /** Where each step's name is announced, and an undo's failure reported; absent: silent. */
  progress?: ((line: string) => void) | undefined;
  /** Put before each announced name (e.g. `[node] `). */
  prefix?: string;
  /** Whether {@link Steps.run} announces each step's name (default true; false when the steps say more themselves). */
  announce?: boolean;
  /** An abort (a Ctrl-C) ends the start after the step that is running. */
  signal?: AbortSignal | undefined;
}

/** The steps of one start and their undo stack. */
export class Steps {
  readonly #undo: { step: string; undo: Undo }[] = [];
  readonly #o: StepsOptions;
  #current = 'start';
  #stopping: Promise<void> | undefined;

  constructor(o: StepsOptions = {}) {
    this.#o = o;
  }

  /**
   * Runs `action` as the step `name` (announced unless the options say not to), after checking
   * for an abort, and checks again once it is done: a Ctrl-C while starting still runs the undos.
   * @returns what the action returned.
   * @throws the action's error unchanged (its message already says what failed), or the abort reason.
   */
  async run<T>(name: string, action: () => Promise<T> | T): Promise<T> {
    this.#o.signal?.throwIfAborted();
    if (this.#stopping) throw new Error(`step ${name} asked after the stop began`);
    this.#current = name;
    if (this.#o.announce !== false) this.#o.progress?.(`${this.#o.prefix ?? ''}${name}`);
    const value = await action();
    this.#o.signal?.throwIfAborted();
    return value;
  }

  /** Puts `undo` on the stack, under the step running now; the stop runs it before earlier ones. */
  defer(undo: Undo): void {
    this.#undo.push({ step: this.#current, undo });
  }

  /**
   * Runs `start` (a list of {@link run} calls); when it throws, the undos run first.
   * @throws what `start` threw.
   */
  async attempt<T>(start: () => Promise<T>): Promise<T> {
    try {
      return await start();
    } catch (err) {
      await this.stop();
      throw err;
    }
  }

  /**
   * Runs every undo once, newest first. One that throws is reported (`while stopping <step>: …`)
   * and the rest still run: a stop always finishes. A second call waits for the first.
   */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      for (const { step, undo } of this.#undo.splice(0).reverse()) {
        try {
          await undo();
        } catch (err) {
          this.#o.progress?.(`while stopping ${step}: ${firstLine(err)}`);
        }
      }
    })();
    return this.#stopping;
  }

  /** Whether {@link stop} was called. */
  get stopped(): boolean {
    return this.#stopping !== undefined;
  }
}
