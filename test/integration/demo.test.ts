/**
 * `npm run demo` in CI: the walkthrough runs as its own process on its own
 * fresh control plane (separate folder, free ports) and must pass every step and exit 0,
 * leaving no process behind.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const DEMO = fileURLToPath(new URL('../../scripts/demo.ts', import.meta.url));
const REPO = fileURLToPath(new URL('../..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'captf-demo-'));
let demo: ChildProcess | undefined;
after(async () => {
  // When the test fails or times out, stop the demo the normal way (it cleans up on
  // SIGTERM), then kill whatever is left of its process group.
  if (demo && demo.exitCode === null && demo.signalCode === null) {
    const exited = new Promise<void>((r) => demo!.once('exit', () => r()));
    demo.kill('SIGTERM');
    await Promise.race([exited, new Promise((r) => setTimeout(r, 30_000))]);
  }
  try {
    if (demo?.pid) process.kill(-demo.pid, 'SIGKILL');
  } catch {
    // the group is already gone
  }
  rmSync(dir, { recursive: true, force: true });
});

/** The steps the demo must report, in order (SPEC §3–§11). */
const STEPS = [
  /start a fresh control plane/,
  /apply examples\//,
  /each namespace gets its mirror, owned by exactly the objects that use it/,
  /CredentialsMirrored=True/,
  /Ready=True \(SecretFound\)/,
  /rotation: a new source value reaches every mirror after one resync/,
  /the provider's manager calls prepare .* — 200 \{mirror: captf-creds-aws-prod, .*401 without a token/,
  /captf-runner drops TF_\* and KUBE_\* variables.*removed KUBE_CONFIG_PATH, TF_TOKEN_app_terraform_io, TF_VAR_region/,
  /narrowing .* revokes team-b/,
  /unprivileged user .* denied by the webhook — admission webhook .* denied the request: user "alice"/,
  /deleting an identity still in use is refused — admission webhook .* denied the request/,
  /allowed once unused/,
  /no credential value appeared/,
];

it('npm run demo passes every step and exits 0', { timeout: 10 * 60_000 }, async (t) => {
  const child = spawn(process.execPath, [DEMO, '--dir', join(dir, 'state')], {
    cwd: REPO,
    env: { PATH: process.env.PATH, HOME: process.env.HOME },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  demo = child;
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const children = new Set<number>();
  // Sample the demo's children while it runs, to check none outlives it.
  const sampler = setInterval(() => {
    try {
      for (const p of execFileSync('ps', ['-o', 'pid=', '--ppid', String(child.pid)], { encoding: 'utf8' }).split('\n'))
        if (Number(p) > 0) children.add(Number(p));
    } catch {
      // no children right now
    }
  }, 500);
  const code = await new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
  clearInterval(sampler);
  t.diagnostic(
    out
      .split('\n')
      .filter((l) => /^[✔✖]|demo (passed|FAILED)/.test(l))
      .join('\n'),
  );
  assert.equal(code, 0, out);
  const stepLines = out.split('\n').filter((l) => /^[✔✖] /.test(l));
  assert.equal(stepLines.length, STEPS.length, out);
  STEPS.forEach((re, i) => {
    assert.match(stepLines[i]!, /^✔/, stepLines[i]);
    assert.match(stepLines[i]!, re);
  });
  assert.match(out, /demo passed: 13 steps/);
  assert.ok(children.size >= 6, `saw the control plane and the functions as children (${children.size})`);
  const alive = [...children].filter((p) => {
    try {
      process.kill(p, 0);
      return true;
    } catch {
      return false;
    }
  });
  assert.deepEqual(alive, [], 'no process outlives the demo');
});
