/**
 * `captf-runner`'s command line and exit statuses, decided without running anything. Pure.
 *
 * Usage: `captf-runner -- <command> [args…]`. Everything after the first `--` is the command,
 * passed on unchanged (no shell). `-h`/`--help` prints the usage. Anything else is a usage
 * error, so a future runner option can never be mistaken for a command.
 */

/** Exit status for a usage error (no `--`, or nothing after it). */
export const EXIT_USAGE = 2;
/** Exit status when the runner itself fails to start the command for another reason. */
export const EXIT_RUNNER_FAILED = 125;
/** Exit status when the command exists but cannot be executed (permission, not a program). */
export const EXIT_NOT_EXECUTABLE = 126;
/** Exit status when the command is not found (not on `PATH`, or no such file). */
export const EXIT_NOT_FOUND = 127;

/** The usage text, one line. */
export const USAGE = 'usage: captf-runner -- <command> [args...]';

/** What the command line asks for. */
export type Invocation =
  { kind: 'run'; command: string; args: string[] } | { kind: 'help' } | { kind: 'usage-error'; message: string };

/**
 * Parses the runner's arguments.
 * @param argv the arguments after the script (`process.argv.slice(2)`).
 * @returns `run` with the command and its arguments, `help`, or `usage-error` with a message.
 */
export function parseCommandLine(argv: readonly string[]): Invocation {
  const first = argv[0];
  if (first === '-h' || first === '--help') return { kind: 'help' };
  if (first !== '--') {
    return {
      kind: 'usage-error',
      message:
        first === undefined ? 'no command given' : `expected "--" before the command, got ${JSON.stringify(first)}`,
    };
  }
  const [command, ...args] = argv.slice(1);
  if (command === undefined || command === '') return { kind: 'usage-error', message: 'no command given after "--"' };
  return { kind: 'run', command, args };
}

/**
 * The runner's exit status once the command ended, as a shell reports it.
 * @param code the command's exit code, or null when it was killed by a signal.
 * @param signal the signal name that killed it (e.g. `SIGKILL`), or null.
 * @param signalNumbers name → number table (`os.constants.signals`).
 * @returns `code` when it exited; 128 + the signal number when killed by a signal; 125 when
 *   neither is known (should not happen).
 */
export function exitStatusOf(
  code: number | null,
  signal: string | null,
  signalNumbers: Readonly<Record<string, number>>,
): number {
  if (code !== null) return code;
  const n = signal ? signalNumbers[signal] : undefined;
  return n === undefined ? EXIT_RUNNER_FAILED : 128 + n;
}

/**
 * The runner's exit status when the command could not be started.
 * @param errorCode the spawn error's `code` (`ENOENT`, `EACCES`, …).
 * @returns 127 for not found (`ENOENT`, `ENOTDIR`), 126 for found but not executable
 *   (`EACCES`, `ENOEXEC`, `EISDIR`, `EPERM`), otherwise 125.
 */
export function exitStatusForSpawnError(errorCode: string | undefined): number {
  switch (errorCode) {
    case 'ENOENT':
    case 'ENOTDIR':
      return EXIT_NOT_FOUND;
    case 'EACCES':
    case 'ENOEXEC':
    case 'EISDIR':
    case 'EPERM':
      return EXIT_NOT_EXECUTABLE;
    default:
      return EXIT_RUNNER_FAILED;
  }
}
