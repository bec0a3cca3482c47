/**
 * Runs a function as the container does — `node functions/main.ts <name>` — through the
 * scripts' one spawn-and-wait helper (scripts/lib/process.ts), and exposes its combined output,
 * the port it reported in its `listening` log line, and its exit.
 */
import { spawnFunction as spawnListening, type FunctionProcess as Spawned } from '../../scripts/lib/process.ts';
import { scanLater } from './leaks.ts';

/** A function running as a child process. */
export interface FunctionProcess extends Spawned {
  /** Everything printed so far (stdout + stderr). */
  output(): string;
}

/**
 * Spawns `node functions/main.ts <name>` with `env` added to this process's environment
 * (PORT defaults to 0) and waits for its `listening` line.
 * @throws Error with its last output lines when it exits or does not listen within 30 s.
 */
export async function spawnFunction(name: string, env: NodeJS.ProcessEnv): Promise<FunctionProcess> {
  let out = '';
  const fn = await spawnListening({
    name,
    env: { ...process.env, PORT: '0', ...env },
    onData: (d) => (out += d.toString()),
  });
  scanLater(`${name} output`, () => out);
  return { ...fn, output: () => out };
}
