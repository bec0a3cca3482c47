/** One way to run a command to its end and take its output (Go builds, skopeo, a user's shell lines). */
import { spawn } from 'node:child_process';

/**
 * Runs a command with `opts.env` added to this process's environment.
 * @param opts.onLines told how many stderr lines each chunk completed (progress).
 * @param opts.timeoutMs SIGTERM after this long (default none).
 * @returns its stdout.
 * @throws Error naming the command, its folder and exit code, with the last 40 lines of its stderr.
 */
export function runCommand(
  cmd: string,
  args: string[],
  opts: { cwd: string; env?: NodeJS.ProcessEnv; onLines?: (n: number) => void; timeoutMs?: number },
): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(cmd, args, {
      cwd: opts.cwd,
      env: { ...process.env, ...opts.env },
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(opts.timeoutMs ? { timeout: opts.timeoutMs } : {}),
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => {
      const text = d.toString();
      err += text;
      opts.onLines?.(text.split('\n').length - 1);
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolvePromise(out);
      else
        reject(
          new Error(
            `${cmd} ${args.join(' ')} (in ${opts.cwd}) exited ${code ?? child.signalCode}:\n${err.split('\n').slice(-40).join('\n')}`,
          ),
        );
    });
  });
}
