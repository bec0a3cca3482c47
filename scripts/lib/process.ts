/**
 * The one spawn-a-function-and-wait-until-it-listens helper of `npm start`, the bench and the
 * tests: runs `node <main> <function>` (the container's entrypoint, or the production bundle),
 * follows its output line by line and resolves once its `listening` log line names the port.
 * Also the graceful stop (SIGTERM, then SIGKILL) every script uses for its children.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, openSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../tools/build.ts';

/** How many of a function's last output lines an error quotes. */
const TAIL_LINES = 20;

/** Calls `onLine` once per complete line of `stream` (and for a last unterminated one at its end). */
export function onLines(stream: NodeJS.ReadableStream, onLine: (line: string) => void): void {
  let partial = '';
  stream.on('data', (d: Buffer) => {
    const parts = (partial + d.toString()).split('\n');
    partial = parts.pop() ?? '';
    for (const p of parts) onLine(p);
  });
  stream.on('end', () => partial && onLine(partial));
}

/** True while `child` has neither exited nor been killed by a signal. */
export const isRunning = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null;

/** SIGTERM (graceful: in-flight requests finish), SIGKILL after `graceMs`; resolves once it exited. */
export async function stopProcess(child: ChildProcess, graceMs = 10_000): Promise<void> {
  if (!isRunning(child)) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(t);
}

/** Options of {@link spawnFunction}. */
export interface SpawnFunctionOptions {
  /** The function: `admission`, `mirror-sync` or `identity-status`. */
  name: string;
  /** Its whole environment (nothing is inherited); PORT=0 lets it pick a free port. */
  env: NodeJS.ProcessEnv;
  /** The entrypoint; default `functions/main.ts` (a bundle's `dist/main.mjs` for the bench). */
  main?: string;
  /** Each output line (stdout and stderr), as it arrives. */
  onLine?: (line: string) => void;
  /** Each raw output chunk (stdout and stderr). */
  onData?: (chunk: Buffer) => void;
  /** A file its output is written to, closed when it exits. */
  logFile?: string;
  /** How long it may take to log `listening` (default 30 s). */
  listenTimeoutMs?: number;
}

/** A function running as a child process, listening. */
export interface FunctionProcess {
  name: string;
  child: ChildProcess;
  pid: number;
  /** Port and scheme from the `listening` log line. */
  port: number;
  scheme: string;
  /** `http(s)://127.0.0.1:<port>` */
  url: string;
  /** Milliseconds from spawn to the `listening` line. */
  listenedMs: number;
  /** Its last output lines (for error messages). */
  tail(): string[];
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
  /** SIGKILL if still running (for `finally`). */
  kill(): void;
  /** {@link stopProcess}: SIGTERM, SIGKILL after `graceMs` (default 10 s). */
  stop(graceMs?: number): Promise<void>;
}

/** The port and scheme of a `listening` JSON log line; undefined for any other line. */
export function listeningLine(line: string): { port: number; scheme: string } | undefined {
  if (!line.includes('"listening"')) return undefined;
  try {
    const j = JSON.parse(line) as { message?: string; port?: number; scheme?: string };
    if (j.message === 'listening' && typeof j.port === 'number') return { port: j.port, scheme: j.scheme ?? 'http' };
  } catch {
    // plain text that mentions "listening"
  }
  return undefined;
}

/** Spawns `node <main> <name>`, SIGKILLed if this process exits first (no function is left behind). */
function spawnNode(opts: SpawnFunctionOptions): ChildProcess {
  const main = opts.main ?? join(REPO_ROOT, 'functions', 'main.ts');
  const child = spawn(process.execPath, [main, opts.name], {
    env: opts.env,
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  child.once('exit', () => process.off('exit', killOnExit));
  return child;
}

/**
 * Follows a child's output: keeps the last lines, passes chunks and lines on, and resolves
 * the returned promise at the `listening` line.
 */
function followOutput(child: ChildProcess, opts: SpawnFunctionOptions, logFd: number | undefined) {
  const tail: string[] = [];
  let seen!: (v: { port: number; scheme: string }) => void;
  const listening = new Promise<{ port: number; scheme: string }>((r) => (seen = r));
  const onLine = (l: string) => {
    tail.push(l);
    if (tail.length > TAIL_LINES) tail.shift();
    const bound = listeningLine(l);
    if (bound) seen(bound);
    opts.onLine?.(l);
  };
  const file = logFd === undefined ? undefined : createWriteStream('', { fd: logFd });
  // A full disk must not take the starter down; the function's own output is the log.
  file?.on('error', () => undefined);
  if (file) child.once('close', () => file.end());
  for (const stream of [child.stdout!, child.stderr!]) {
    if (opts.onData) stream.on('data', opts.onData);
    if (file) stream.on('data', (d: Buffer) => file.write(d));
    onLines(stream, onLine);
  }
  return { tail, listening };
}

/**
 * Spawns a function (see {@link SpawnFunctionOptions}) and resolves once it logged
 * `listening` with its port.
 * @throws Error `<name> exited (<code>)` or `<name> did not listen within 30 s`, with its last
 *   output lines; the process is killed first.
 */
export async function spawnFunction(opts: SpawnFunctionOptions): Promise<FunctionProcess> {
  const timeoutMs = opts.listenTimeoutMs ?? 30_000;
  const t0 = performance.now();
  // Opened first: a log file that cannot be written fails the start before anything runs.
  const logFd = opts.logFile === undefined ? undefined : openSync(opts.logFile, 'w');
  const child = spawnNode(opts);
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const { tail, listening } = followOutput(child, opts, logFd);
  const first = await Promise.race([
    listening,
    exited.then(() => 'exited' as const),
    new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), timeoutMs).unref()),
  ]);
  if (first === 'exited' || first === 'timeout') {
    child.kill('SIGKILL');
    const why =
      first === 'exited'
        ? `exited (${child.exitCode ?? child.signalCode})`
        : `did not listen within ${timeoutMs / 1000} s`;
    throw new Error(`${opts.name} ${why}:\n${tail.join('\n')}`);
  }
  return {
    name: opts.name,
    child,
    pid: child.pid!,
    ...first,
    url: `${first.scheme}://127.0.0.1:${first.port}`,
    listenedMs: performance.now() - t0,
    tail: () => [...tail],
    exited,
    kill: () => void (isRunning(child) && child.kill('SIGKILL')),
    stop: (graceMs) => stopProcess(child, graceMs),
  };
}

/**
 * How long after the first signal another one counts as the same: a terminal's Ctrl-C reaches
 * the whole foreground process group, and `npm run` forwards what it got to its child as well,
 * so one keypress arrives twice within milliseconds.
 */
const SAME_SIGNAL_MS = 2000;

/**
 * SIGINT and SIGTERM for an entry point that starts a system. While it starts (`stop` returns
 * undefined), a signal aborts the returned signal: the starter stops what it began and throws,
 * and the entry point exits. Once it runs, a signal calls `stop()` and exits with `code`. A
 * second signal more than {@link SAME_SIGNAL_MS} after the first exits at once (children are
 * SIGKILLed on exit, see spawnNode); one sooner is the same keypress and is ignored.
 * @param stop the running system's stop, or undefined while it starts.
 * @param say a line for the user when a signal arrives.
 * @param code the exit code after a stop (default 130; for `npm start` a Ctrl-C is the normal end: 0).
 */
export function stopOnSignal(
  stop: () => Promise<void> | undefined,
  say?: (signal: NodeJS.Signals) => void,
  code = 130,
): AbortSignal {
  const abort = new AbortController();
  let firstAt = 0;
  const on = (signal: NodeJS.Signals) => {
    if (abort.signal.aborted) {
      if (performance.now() - firstAt < SAME_SIGNAL_MS) return;
      process.exit(130);
    }
    firstAt = performance.now();
    say?.(signal);
    abort.abort(new Error(`interrupted by ${signal}`));
    void stop()?.finally(() => process.exit(code));
  };
  process.on('SIGINT', on);
  process.on('SIGTERM', on);
  return abort.signal;
}
