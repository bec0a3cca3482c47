/**
 * Runs a function as the container does — `node functions/main.ts <name>` — and exposes
 * its combined output, the port it reported in its `listening` log line, and its exit.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { REPO_ROOT } from '../../scripts/controlplane/build.ts';
import { eventually } from './cluster.ts';

/** A function running as a child process. */
export interface FunctionProcess {
  child: ChildProcess;
  /** Port from the `listening` log line. */
  port: number;
  /** Everything printed so far (stdout + stderr). */
  output(): string;
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
  /** SIGKILL if still running (for `finally`). */
  kill(): void;
}

/**
 * Spawns `node functions/main.ts <name>` with `env` added to this process's environment
 * (PORT defaults to 0) and waits for its `listening` line.
 * @throws Error with the output when it does not listen within 30 s.
 */
export async function spawnFunction(name: string, env: NodeJS.ProcessEnv): Promise<FunctionProcess> {
  const child = spawn(process.execPath, ['functions/main.ts', name], {
    cwd: REPO_ROOT,
    env: { ...process.env, PORT: '0', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((res) => child.on('exit', (code) => res(code)));
  const kill = () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  };
  try {
    const port = await eventually(
      `${name} to listen`,
      async () => {
        if (child.exitCode !== null) throw new Error(`exited ${child.exitCode}: ${out}`);
        const line = out.split('\n').find((l) => l.includes('"listening"'));
        return line ? (JSON.parse(line) as { port: number }).port : undefined;
      },
      30_000,
    );
    return { child, port, output: () => out, exited, kill };
  } catch (err) {
    kill();
    throw err;
  }
}
