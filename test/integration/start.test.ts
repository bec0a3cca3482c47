/**
 * `npm start` as a real process (SPEC §14): on its own embedded control plane it reaches
 * the ready line, mirrors the examples and prints one readable line per change, and stops
 * every process it started on SIGINT; with `--kubeconfig` it runs against that cluster,
 * installs nothing there unless told, and leaves the cluster running.
 */
import assert from 'node:assert/strict';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { AdmissionregistrationV1Api, ApiextensionsV1Api, CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import { isNotFound } from '../../functions/lib/kube.ts';
import { startControlPlane, type ControlPlane } from '../../scripts/controlplane/controlplane.ts';
import { installCRDs } from '../../scripts/controlplane/crds.ts';
import { applyExamples, loadExamples } from '../../scripts/local/examples.ts';
import { WEBHOOK_CONFIGURATION } from '../../scripts/local/system.ts';
import { eventually } from '../helpers/cluster.ts';

const START = fileURLToPath(new URL('../../scripts/start.ts', import.meta.url));
const REPO = fileURLToPath(new URL('../..', import.meta.url));
const work = mkdtempSync(join(tmpdir(), 'captf-start-'));
const running: ChildProcess[] = [];
const planes: ControlPlane[] = [];
after(async () => {
  // A test that failed half-way leaves `npm start` running: stop it the normal way (SIGTERM
  // stops its children too), then kill whatever is left of its process group.
  for (const c of running) await stopGroup(c);
  for (const cp of planes) await cp.stop();
  rmSync(work, { recursive: true, force: true });
});

/** SIGTERM, up to 30 s to exit, then SIGKILL to the whole process group (spawned detached). */
async function stopGroup(c: ChildProcess): Promise<void> {
  if (c.exitCode === null && c.signalCode === null) {
    const exited = new Promise<void>((r) => c.once('exit', () => r()));
    c.kill('SIGTERM');
    await Promise.race([exited, new Promise((r) => setTimeout(r, 30_000))]);
  }
  try {
    process.kill(-c.pid!, 'SIGKILL');
  } catch {
    // the group is already gone
  }
}

interface StartRun {
  child: ChildProcess;
  output: () => string;
  /** Resolves with the output once the ready block was printed; rejects if it exits first. */
  ready: Promise<string>;
  exited: Promise<number | null>;
}

function start(args: string[], env: NodeJS.ProcessEnv = {}): StartRun {
  const child = spawn(process.execPath, [START, ...args], {
    cwd: REPO,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  running.push(child);
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  const ready = new Promise<string>((resolve, reject) => {
    const check = () => out.includes('Ctrl-C stops everything') && resolve(out);
    child.stdout!.on('data', check);
    void exited.then((code) => reject(new Error(`npm start exited (${code}) before ready:\n${out}`)));
  });
  // Runs that are meant to fail never await `ready`.
  ready.catch(() => undefined);
  return { child, output: () => out, ready, exited };
}

/** Pids of the direct children of `pid` (from ps). */
function childrenOf(pid: number): number[] {
  try {
    return execFileSync('ps', ['-o', 'pid=', '--ppid', String(pid)], { encoding: 'utf8' })
      .split('\n')
      .map((s) => Number(s.trim()))
      .filter((n) => n > 0);
  } catch {
    return [];
  }
}
const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('npm start on an embedded control plane', () => {
  it('reaches the ready line, mirrors the examples with one line per change, and SIGINT stops every process', async (t) => {
    const run = start(['--dir', join(work, 'embedded'), '--local-events', '--resync', '3s', '--status', '3s']);
    const t0 = performance.now();
    const banner = await run.ready;
    t.diagnostic(`ready after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
    const kubeconfig = /export KUBECONFIG=(\S+)/.exec(banner)?.[1];
    assert.ok(kubeconfig, 'prints where the kubeconfig is');
    assert.match(banner, /webhook registered/);
    assert.match(banner, /local event source/);
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfig);
    assert.match(kc.getCurrentCluster()!.server, /^https:\/\/127\.0\.0\.1:\d+$/);
    const vwc = await kc
      .makeApiClient(AdmissionregistrationV1Api)
      .readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION });
    assert.equal(vwc.webhooks?.[0]?.failurePolicy, 'Fail');
    assert.deepEqual(vwc.webhooks?.[0]?.rules?.[0]?.resources, ['terraformclusteridentities']);

    await applyExamples(kc);
    const expected = [
      /mirror\s+team-a\/captf-creds-aws-prod\s+(created|updated).*TerraformCluster\/prod/,
      /mirror-sync\s+TerraformCluster team-a\/prod\s+mirrored \(captf-creds-aws-prod of identity aws-prod\)/,
      /mirror-sync\s+TerraformMachine team-c\/dev-worker-0\s+mirrored \(captf-creds-gcp-dev/,
      /identity-status\s+identity gcp-dev\s+Ready=True \(SecretFound\), in use in \[team-c\]/,
    ];
    await eventually(
      'the readable lines about the examples',
      async () => expected.every((re) => re.test(run.output())),
      60_000,
    );
    const core = kc.makeApiClient(CoreV1Api);
    const mirror = await eventually('the team-b mirror', () =>
      core.readNamespacedSecret({ namespace: 'team-b', name: 'captf-creds-aws-prod' }).catch(() => undefined),
    );
    assert.deepEqual(
      mirror.metadata?.ownerReferences?.map((o) => `${o.kind}/${o.name}`),
      ['TerraformCluster/staging'],
    );
    // A few resync and status ticks later, nothing new is printed for unchanged objects.
    const lines = () =>
      run
        .output()
        .split('\n')
        .filter((l) => /TerraformCluster team-a\/prod\s+mirrored/.test(l)).length;
    const before = lines();
    await new Promise((r) => setTimeout(r, 7000));
    assert.equal(lines(), before, 'an unchanged reconcile is not printed again');

    const pid = run.child.pid!;
    const children = childrenOf(pid);
    assert.ok(
      children.length >= 6,
      `etcd, apiserver, controller-manager and three functions run under it (${children.length})`,
    );
    run.child.kill('SIGINT');
    assert.equal(await run.exited, 0);
    await eventually('every child to be gone', async () => children.every((c) => !alive(c)), 20_000);
    assert.match(run.output(), /SIGINT: stopping/);

    // No credential value from the examples appeared in the output.
    const values = loadExamples().flatMap((o) =>
      Object.values((o as { stringData?: Record<string, string> }).stringData ?? {}),
    );
    for (const v of values) assert.ok(!run.output().includes(v), 'no Secret value in the output');
  });
});

describe('npm start with the real event source (issue 14 item 6)', () => {
  it("prints the ApiServerSource adapter's errors when it cannot deliver (mirror-sync down)", async () => {
    const run = start(['--dir', join(work, 'adapter'), '--resync', '1h', '--status', '1h']);
    const banner = await run.ready;
    assert.match(banner, /ApiServerSource adapter/);
    const kubeconfig = /export KUBECONFIG=(\S+)/.exec(banner)![1]!;
    const mirrorSync = childrenOf(run.child.pid!).find((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes('mirror-sync');
      } catch {
        return false;
      }
    });
    assert.ok(mirrorSync, 'mirror-sync runs under npm start');
    process.kill(mirrorSync, 'SIGKILL');
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfig);
    // A namespace event goes to mirror-sync through the adapter, which now cannot reach it.
    await kc.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name: 'nobody-listens' } } });
    await eventually(
      "the adapter's error line",
      async () => /events\s+adapter captf-objects\s+error: /.test(run.output()),
      60_000,
    );
    run.child.kill('SIGINT');
    await run.exited;
  });
});

describe('npm start against a named cluster', () => {
  it('never installs anything unless told: without CRDs it stops and says why; with them it runs and leaves the cluster up; --install adds the webhook until exit', async () => {
    const cp = await startControlPlane({ dir: join(work, 'named'), log: () => undefined });
    planes.push(cp);
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfigPath);
    const ext = kc.makeApiClient(ApiextensionsV1Api);

    const bare = start(['--kubeconfig', cp.kubeconfigPath, '--dir', join(work, 'named-state'), '--local-events']);
    assert.equal(await bare.exited, 1);
    assert.match(bare.output(), /are the CRDs installed\?.*--install/);
    assert.equal((await ext.listCustomResourceDefinition()).items.length, 0, 'no CRD was installed');

    await installCRDs(kc);
    const run = start(['--kubeconfig', cp.kubeconfigPath, '--dir', join(work, 'named-state'), '--local-events']);
    const banner = await run.ready;
    assert.match(banner, /webhook NOT registered/);
    assert.ok(banner.includes(`export KUBECONFIG=${cp.kubeconfigPath}`));
    await kc
      .makeApiClient(AdmissionregistrationV1Api)
      .readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION })
      .then(
        () => assert.fail('no webhook configuration is registered on a named cluster without --install'),
        (e: unknown) => assert.ok(isNotFound(e)),
      );
    await applyExamples(kc);
    await eventually('the mirror in team-a', async () =>
      /mirror-sync\s+TerraformCluster team-a\/prod\s+mirrored/.test(run.output()),
    );
    run.child.kill('SIGINT');
    assert.equal(await run.exited, 0);
    assert.doesNotMatch(run.output(), /and the control plane/);
    // The cluster is still there and still has the mirror.
    await kc.makeApiClient(CoreV1Api).readNamespacedSecret({ namespace: 'team-a', name: 'captf-creds-aws-prod' });

    // --install on a cluster on this machine registers the webhook, and removes it on exit
    // (left behind, failurePolicy Fail would block every identity write).
    const installing = start([
      '--kubeconfig',
      cp.kubeconfigPath,
      '--dir',
      join(work, 'named-state'),
      '--local-events',
      '--install',
    ]);
    assert.match(await installing.ready, /webhook registered/);
    const adm = kc.makeApiClient(AdmissionregistrationV1Api);
    await adm.readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION });
    installing.child.kill('SIGINT');
    assert.equal(await installing.exited, 0);
    await adm.readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION }).then(
      () => assert.fail('the webhook configuration was removed on exit'),
      (e: unknown) => assert.ok(isNotFound(e)),
    );
  });

  it('--use-current-context needs KUBECONFIG; bad durations are usage errors', async () => {
    const noKc = start(['--use-current-context']);
    assert.equal(await noKc.exited, 2);
    assert.match(noKc.output(), /needs KUBECONFIG/);
    const bad = start(['--resync', 'soon']);
    assert.equal(await bad.exited, 2);
    assert.match(bad.output(), /"soon" is not a duration/);
  });
});
