/**
 * `npm test`: type-checks nothing (that is `npm run typecheck`), then
 * 1. builds the control plane if its pinned binaries are not cached (with progress),
 * 2. starts ONE control plane for the whole run in `.local/test-controlplane-<pid>` with the
 *    CRDs (the one system starter, scripts/system/system.ts, with no functions or events),
 * 3. runs every unit and integration test file with node:test, each integration file in its
 *    own namespaces, the control plane's folder passed as `CAPTF_TEST_CONTROLPLANE`,
 * 4. stops the control plane even when tests fail or the run is interrupted.
 * Extra arguments are passed to `node --test` (e.g. `npm test -- --test-name-pattern=mirror`).
 * Exit code: node --test's.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { globSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { stopOnSignal } from './lib/process.ts';
import { startSystem, type RunningSystem } from './system/system.ts';
import { REPO_ROOT } from './tools/build.ts';

// One folder per run, so two runs on one machine never share etcd or certificates.
const dir = join(REPO_ROOT, '.local', `test-controlplane-${process.pid}`);
const extra = process.argv.slice(2);
const files = extra.some((a) => !a.startsWith('-'))
  ? extra.filter((a) => !a.startsWith('-'))
  : globSync(['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts'], { cwd: REPO_ROOT }).sort();
const flags = extra.filter((a) => a.startsWith('-'));

const t0 = Date.now();
let system: RunningSystem | undefined;
let runner: ChildProcess | undefined;
let stopping: Promise<void> | undefined;
const signal = stopOnSignal(
  () => {
    // A signal sent to this process alone (not to the group) must end the files too: their
    // nodes' holders tear down when the files are gone.
    runner?.kill('SIGTERM');
    return (stopping = system?.stop().then(() => rmSync(dir, { recursive: true, force: true })));
  },
  (sig) => console.error(`${sig}: stopping the control plane`),
);
system = await startSystem({ dir, progress: (l) => console.error(l), signal }).catch((err: unknown) => {
  if (signal.aborted) process.exit(130);
  throw err;
});
const cp = system.controlPlane!;
let code: number;
try {
  console.error(
    `[test] control plane ready in ${Math.round((Date.now() - t0) / 1000)}s (${cp.binaries.origin}): ${cp.server}`,
  );
  code = await new Promise<number>((res) => {
    const child = (runner = spawn(
      process.execPath,
      ['--test', '--test-reporter=spec', '--test-concurrency=3', '--test-timeout=600000', ...flags, ...files],
      {
        cwd: REPO_ROOT,
        stdio: 'inherit',
        // One planted-value prefix for the whole run (test/helpers/leaks.ts scans every file's output for it).
        env: {
          ...process.env,
          CAPTF_TEST_CONTROLPLANE: dir,
          KUBECONFIG: cp.kubeconfigPath,
          CAPTF_TEST_SENTINEL: `CAPTFLEAK${randomBytes(6).toString('hex')}`,
        },
      },
    ));
    child.on('close', (c) => res(c ?? 1));
  });
} finally {
  if (!signal.aborted) {
    await system.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
// Interrupted, the runner's child (in the same group) may end first: the stop the signal
// began must finish, and it exits when it has.
await stopping;
process.exit(code);
