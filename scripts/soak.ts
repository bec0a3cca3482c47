/**
 * `npm run soak` — the large sizes of the reliability suite, with figures.
 * 1. the hostile-input fuzz — fast-check AdmissionReviews and CloudEvents posted to
 *    admission, mirror-sync and identity-status (child processes from source), each case followed by a
 *    known-good request — at 4 000 cases per function (12 000 in all) by default;
 * 2. the storm, fault and privilege suites (test/integration/churn, faults and
 *    admission-privilege) at soak size through `scripts/test.ts` — the churn storm for
 *    `--churn-seconds` (default 120) — with their figures gathered from the tests' diagnostics.
 * `--skip-suites` runs the fuzz only.
 * `--serving` runs instead the fault suite on the Serving node (test/integration/serving-faults)
 * at soak size: `--changes N` consumer changes per burst (default 600), each scenario
 * `--rounds R` times in a row (default 3); it prints each scenario's times to converge. Root.
 *
 * Starts a control plane of its own in `.local/soak-<pid>` (as `npm test` does), or uses
 * `--kubeconfig PATH`. Options: `--cases N` per function, `--seed S` and `--path P` to replay
 * a failure fast-check printed, `--only NAME` for one function.
 * Exit code 0 when every property held, 1 when one failed (its seed, path and counterexample
 * are printed), 2 on a usage error.
 */
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { isRunning, stopOnSignal } from './lib/process.ts';
import { prepareCaller, type PrepareCaller } from './lib/serviceaccount.ts';
import { describeFigures, fuzz, type FuzzFigures } from './soak/fuzz.ts';
import { FUZZ_ENV, fuzzTargets, newTallies, tallyLine, type LogTally } from './soak/targets.ts';
import { FUNCTION_NAMES, startSystem, type FunctionName, type RunningSystem } from './system/system.ts';
import { REPO_ROOT } from './tools/build.ts';

/** Cases per function by default (four functions: ≥ 16 000 in all). */
export const DEFAULT_CASES = 4_000;

interface Options {
  cases: number;
  seed?: number | undefined;
  path?: string | undefined;
  only?: string | undefined;
  kubeconfig?: string | undefined;
  churnSeconds: number;
  skipSuites: boolean;
  serving?: { changes: number; rounds: number } | undefined;
}

/** `value` of option `--name` as a positive integer. @throws Error saying what is wrong otherwise. */
function positive(name: string, value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} ${value} must be a positive integer`);
  return n;
}

function options(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      cases: { type: 'string' },
      seed: { type: 'string' },
      path: { type: 'string' },
      only: { type: 'string' },
      kubeconfig: { type: 'string' },
      'churn-seconds': { type: 'string' },
      'skip-suites': { type: 'boolean' },
      serving: { type: 'boolean' },
      changes: { type: 'string' },
      rounds: { type: 'string' },
    },
  });
  const serving = {
    changes: positive('changes', values.changes ?? '600'),
    rounds: positive('rounds', values.rounds ?? '3'),
  };
  return {
    cases: positive('cases', values.cases ?? String(DEFAULT_CASES)),
    seed: values.seed === undefined ? undefined : Number(values.seed),
    path: values.path,
    only: values.only,
    kubeconfig: values.kubeconfig,
    churnSeconds: Number(values['churn-seconds'] ?? 120),
    skipSuites: values['skip-suites'] ?? false,
    serving: values.serving ? serving : undefined,
  };
}

/**
 * The functions from source against a control plane of the soak's own (or `--kubeconfig`),
 * and a caller allowed to prepare (a ServiceAccount in `default` with the shipped prepare role
 * and an audience-bound token); runs the fuzz against each function in turn and prints one
 * line per function and the totals.
 */
async function fuzzAll(opts: Options): Promise<boolean> {
  const logs = newTallies();
  const dir = join(REPO_ROOT, '.local', `soak-${process.pid}`);
  let system: RunningSystem | undefined;
  const signal = stopOnSignal(() => system?.stop().then(() => rmSync(dir, { recursive: true, force: true })));
  system = await startSystem({
    signal,
    dir,
    progress: (l) => console.error(l),
    cluster: opts.kubeconfig ? { kubeconfig: opts.kubeconfig, install: false } : undefined,
    functions: 'source',
    env: FUZZ_ENV,
    onRawLine: (c, l) => logs[c as FunctionName] && tallyLine(logs[c as FunctionName], l),
  }).catch((err: unknown) => {
    if (signal.aborted) process.exit(130);
    throw err;
  });
  const running = system;
  const urls = Object.fromEntries(FUNCTION_NAMES.map((n) => [n, running.functions[n].url])) as Record<
    FunctionName,
    string
  >;
  const all: FuzzFigures[] = [];
  let caller: PrepareCaller | undefined;
  try {
    const id = randomBytes(4).toString('hex');
    caller = await prepareCaller(running.kc, { namespace: 'default', name: `captf-fuzz-manager-${id}`, suffix: id });
    for (const target of fuzzTargets(urls, caller.authorization).filter((t) => !opts.only || t.name === opts.only)) {
      console.error(`[soak] fuzz ${target.name}: ${opts.cases} cases…`);
      const f = await fuzz(target, { numRuns: opts.cases, seed: opts.seed, path: opts.path });
      all.push(f);
      console.log(describeFigures(f));
      const errors = logs[target.name as FunctionName].errors;
      if (errors.length) console.log(`  ${errors.length} error log line(s), first: ${errors[0]}`);
      if (f.failure) console.log(`  FAILED\n${f.failure}`);
    }
    // A function that crashed is a failure even when every answer before it was right.
    for (const n of FUNCTION_NAMES)
      if (!isRunning(running.functions[n].child)) logs[n].errors.push('the process exited');
  } finally {
    await caller?.cleanup();
    await running.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  return printTotals(all, logs);
}

function printTotals(all: FuzzFigures[], logs: Record<string, LogTally>): boolean {
  const cases = all.reduce((n, f) => n + f.cases, 0);
  const requests = all.reduce((n, f) => n + f.requests, 0);
  const count = (f: FuzzFigures, pick: (status: string) => boolean) =>
    Object.entries(f.byStatus).reduce((n, [s, k]) => n + (pick(s) ? k : 0), 0);
  const fiveHundreds = all.reduce((n, f) => n + count(f, (s) => Number(s) >= 500), 0);
  const dropped = all.reduce((n, f) => n + count(f, (s) => s.startsWith('closed')), 0);
  const failures = all.filter((f) => f.failure).length;
  const errorLines = Object.values(logs).reduce((n, l) => n + l.errors.length, 0);
  const secs = all.reduce((n, f) => n + f.ms, 0) / 1000;
  console.log(
    `fuzz: ${cases} cases, ${requests} requests in ${secs.toFixed(1)} s; 5xx answers: ${fiveHundreds}; ` +
      `connections dropped: ${dropped}; error log lines: ${errorLines}; failed properties: ${failures}`,
  );
  return failures === 0 && errorLines === 0;
}

/** The reliability suites at soak size (their own control plane, through scripts/test.ts); prints their figures. */
async function runSuites(churnSeconds: number): Promise<boolean> {
  const files = [
    'test/integration/churn.test.ts',
    'test/integration/faults.test.ts',
    'test/integration/admission-privilege.test.ts',
  ];
  console.error(`[soak] storm (${churnSeconds} s), faults and privilege suites…`);
  // A pace the Broker and the chaos proxy's delayed and failed deliveries drain (as fast as
  // possible, a 2-minute storm leaves a backlog of thousands of events).
  const { code, text } = await testFiles(files, { CAPTF_CHURN_SECONDS: String(churnSeconds), CAPTF_CHURN_RATE: '6' });
  console.log(suiteFigures(text));
  // What failed, so a soak failure can be read without running the suites again.
  if (code !== 0) console.log(failureLines(text));
  return code === 0;
}

/**
 * The fault suite on the Serving node at soak size (one node; every round of a scenario is its
 * own test, with the runner's per-test bound raised to 30 minutes); prints the times to converge.
 */
async function runServingFaults(o: { changes: number; rounds: number }): Promise<boolean> {
  console.error(`[soak] faults on the Serving node: ${o.changes} changes per burst, ${o.rounds} rounds each…`);
  const { code, text } = await testFiles(['test/integration/serving-faults.test.ts', '--test-timeout=1800000'], {
    CAPTF_FAULT_CHANGES: String(o.changes),
    CAPTF_FAULT_ROUNDS: String(o.rounds),
  });
  console.log(
    text
      // Each test's result and figures (its diagnostics), then the summary.
      .split('\n')
      .filter((l) => /time to converge|^\s*(✔|✖|ℹ)/.test(l))
      .join('\n'),
  );
  if (code !== 0) console.log(failureLines(text));
  return code === 0;
}

/** Runs test files (and runner flags) through scripts/test.ts with `env` added; its exit code and stdout. */
async function testFiles(args: string[], env: Record<string, string>): Promise<{ code: number; text: string }> {
  const out: string[] = [];
  const code = await new Promise<number>((resolve) => {
    const child = spawn(process.execPath, [join(REPO_ROOT, 'scripts', 'test.ts'), ...args], {
      cwd: REPO_ROOT,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    child.stdout.on('data', (d: Buffer) => out.push(d.toString()));
    child.on('close', (c) => resolve(c ?? 1));
  });
  return { code, text: out.join('') };
}

/** The failing tests and their first error lines from node:test's spec output. */
function failureLines(text: string): string {
  const at = text.indexOf('failing tests:');
  return (at < 0 ? text.slice(-4000) : text.slice(at))
    .split('\n')
    .filter((l) => !/^\s+at /.test(l))
    .slice(0, 60)
    .join('\n');
}

/** The figures the suites print as diagnostics, gathered into one summary. */
export function suiteFigures(text: string): string {
  const pick = (re: RegExp) => re.exec(text)?.slice(1) ?? [];
  const [ops = '?', deliveries = '?', fates = '{}'] = pick(/operations (\d+); deliveries (\d+) (\{[^}]*\})/);
  const [seed = '?'] = pick(/seed (\d+)/);
  const [attempts = '?', notRefused = '?'] = pick(/(\d+) bypass attempts, (\d+) not refused/);
  return [
    stormLine({ ops, deliveries, seed, fates: JSON.parse(fates) as Record<string, number> }),
    'faults injected: 3 (kube-apiserver down 10 s, etcd down 10 s, mirror-sync SIGKILL) under ~500 events each',
    `privilege: ${attempts} bypass attempts, ${notRefused} not refused`,
    `violations: ${/ℹ fail 0/.test(text) ? 0 : 'see the failures above'}`,
  ].join('\n');
}

function stormLine(s: { ops: string; deliveries: string; seed: string; fates: Record<string, number> }): string {
  const n = (k: string) => s.fates[k] ?? 0;
  return (
    `storm: ${s.ops} operations, ${s.deliveries} events delivered through the chaos proxy — ` +
    `${n('duplicated')} duplicated, ${n('delayed')} delayed (reordered), ${n('dropped')} dropped (seed ${s.seed})`
  );
}

let opts: Options;
try {
  opts = options(process.argv.slice(2));
} catch (err) {
  console.error(`soak: ${(err as Error).message}`);
  process.exit(2);
}
if (opts.serving) process.exit((await runServingFaults(opts.serving)) ? 0 : 1);
const crashes: string[] = [];
process.on('unhandledRejection', (e) => crashes.push(String(e)));
const ok = await fuzzAll(opts);
console.log(`crashes (uncaught rejections): ${crashes.length}`);
const suitesOk = opts.skipSuites || (await runSuites(opts.churnSeconds));
process.exit(ok && suitesOk && crashes.length === 0 ? 0 : 1);
