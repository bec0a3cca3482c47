#!/usr/bin/env node
/**
 * `captf-runner -- <command> [args…]` — the entrypoint of a Terraform Job (SPEC §11).
 *
 * 1. Removes `TF_*`/`KUBE_*` variables from the environment (rule: ./filter-env.ts); the
 *    credentials stay readable as files under /var/run/captf/credentials.
 * 2. Writes ONE JSON line to stderr naming the removed variables (never their values).
 *    stderr, because the command's stdout is the command's (`terraform output -json | …`).
 * 3. Starts the command with the filtered environment and the runner's stdin, stdout and
 *    stderr. Node cannot exec(2) in place, so the runner stays as the command's parent:
 *    it forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to the command, and exits with the
 *    command's exit code, or 128 + the signal number when the command was killed by a signal.
 *    The command runs in its own session (like dumb-init does), so a signal sent to the
 *    runner's whole process group (Ctrl-C in a terminal) reaches the command once, through
 *    the runner, not twice.
 *
 * Exit statuses of the runner itself: 2 usage error, 127 command not found, 126 command not
 * executable, 125 any other failure to start it (./command-line.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import { createLogger } from '../lib/log.ts';
import {
  EXIT_RUNNER_FAILED,
  EXIT_USAGE,
  USAGE,
  exitStatusForSpawnError,
  exitStatusOf,
  parseCommandLine,
} from './command-line.ts';
import { filterEnvironment } from './filter-env.ts';

/** Signals the runner passes on to the command. */
const FORWARDED_SIGNALS: readonly NodeJS.Signals[] = ['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGQUIT'];

// Fixed level: the one line about removed variables must appear whatever LOG_LEVEL says.
const logger = createLogger('captf-runner', { stream: process.stderr, level: 'info' });

/** Logs one line and resolves once it was handed to stderr, so it precedes the command's output. */
function logLine(level: 'info' | 'error', message: string, meta: Record<string, unknown>): Promise<void> {
  return new Promise((resolve) => {
    logger.transports[0]!.once('logged', () => resolve());
    logger.log(level, message, meta);
  });
}

const invocation = parseCommandLine(process.argv.slice(2));
if (invocation.kind === 'help') {
  process.stdout.write(`${USAGE}\n`);
  process.exit(0);
}
if (invocation.kind === 'usage-error') {
  await logLine('error', `${invocation.message}; ${USAGE}`, { reason: 'Usage' });
  process.exit(EXIT_USAGE);
}

const { env, removed } = filterEnvironment(process.env);
await logLine('info', 'environment filtered', { command: invocation.command, removed });

let child: ChildProcess | undefined;
let finished = false;
const pending: NodeJS.Signals[] = [];
const finish = (status: number): void => {
  if (finished) return;
  finished = true;
  process.exit(status);
};

// Handlers go in before the spawn: a signal that arrives in between is queued, not fatal.
for (const sig of FORWARDED_SIGNALS) {
  process.on(sig, () => {
    if (!child) pending.push(sig);
    else if (child.exitCode === null && child.signalCode === null) child.kill(sig);
  });
}
process.on('uncaughtException', (err) => {
  process.stderr.write(`captf-runner: internal error: ${err.message.split('\n')[0]}\n`);
  child?.kill('SIGKILL');
  finish(EXIT_RUNNER_FAILED);
});

child = spawn(invocation.command, invocation.args, { env, stdio: 'inherit', detached: true });
child.on('error', (err: NodeJS.ErrnoException) => {
  const status = exitStatusForSpawnError(err.code);
  const what =
    status === 127
      ? 'command not found'
      : status === 126
        ? 'command is not executable'
        : 'command could not be started';
  // Only the command's name and the error code: arguments may carry secrets.
  void logLine('error', `${what}: ${invocation.command}`, {
    command: invocation.command,
    code: err.code,
    exitStatus: status,
  }).then(() => finish(status));
});
child.on('exit', (code, signal) => finish(exitStatusOf(code, signal, constants.signals)));
for (const sig of pending.splice(0)) child.kill(sig);
