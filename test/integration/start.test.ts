/**
 * `npm start` as a real process (SPEC §14): on its own embedded control plane it reaches
 * the ready line, says that events flow through Knative's Broker and mirrors the examples
 * through it with one readable line per change, prints what Knative's processes report and
 * what lands in the dead-letter sink, and stops every process it started on SIGINT; with
 * `--kubeconfig` it runs against that cluster only when allowed to install there, refuses a
 * cluster that runs Knative Eventing itself, and leaves the cluster running.
 */
import assert from 'node:assert/strict';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  AdmissionregistrationV1Api,
  ApiextensionsV1Api,
  AppsV1Api,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
} from '@kubernetes/client-node';
import { IDENTITY_RESOURCE } from '../../functions/lib/api.ts';
import { isNotFound } from '../../functions/lib/kube.ts';
import { startControlPlane, type ControlPlane } from '../../scripts/controlplane/controlplane.ts';
import { applyExamples, loadExamples } from '../../scripts/local/examples.ts';
import { WEBHOOK_CONFIGURATION } from '../../scripts/system/webhook.ts';
import { serviceAccountToken } from '../../scripts/lib/serviceaccount.ts';
import { eventually } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { postPrepare, prepareTarget } from '../helpers/prepare.ts';

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

/** The child of `parent` whose command line has `word` as an argument or binary name. */
function childNamed(parent: number, word: string): number | undefined {
  return childrenOf(parent).find((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8')
        .split('\0')
        .some((arg) => arg === word || arg.endsWith(`/${word}`));
    } catch {
      return false;
    }
  });
}

/** The value of `name` in the environment process `pid` started with. */
function environOf(pid: number, name: string): string | undefined {
  const entry = readFileSync(`/proc/${pid}/environ`, 'utf8')
    .split('\0')
    .find((e) => e.startsWith(`${name}=`));
  return entry?.slice(name.length + 1);
}

/** Printed lines of Knative's processes and the dead-letter sink at warning level or above. */
const knativeComplaints = (out: string) =>
  out.split('\n').filter((l) => /^\d\d:\d\d:\d\d {2}(events|dead-letter) .*\s(warn|error|fatal|panic):/.test(l));

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
  it("says events flow through Knative's Broker, mirrors the examples through it with one line per change, and SIGINT stops every process", async (t) => {
    const run = start(['--dir', join(work, 'embedded'), '--resync', '3s', '--status', '3s', '--local-events']);
    const t0 = performance.now();
    const banner = await run.ready;
    t.diagnostic(`ready after ${((performance.now() - t0) / 1000).toFixed(1)}s`);
    const kubeconfig = /export KUBECONFIG=(\S+)/.exec(banner)?.[1];
    assert.ok(kubeconfig, 'prints where the kubeconfig is');
    assert.match(banner, /webhook registered/);
    assert.match(
      banner,
      /events: Knative's ApiServerSource adapter → Broker captf \(ingress, filter, in-memory channel\) → Triggers; pings: mtping, status every 3s \(\*\/3 \* \* \* \* \*\), resync every 3s/,
    );
    assert.match(banner, /--build-adapter and --local-events are no longer needed/);
    const brokerUrl = /broker: (\S+)/.exec(banner)?.[1];
    assert.match(brokerUrl ?? '', /^http:\/\/127\.0\.0\.1:\d+\/captf-system\/captf$/);
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfig);
    assert.match(kc.getCurrentCluster()!.server, /^https:\/\/127\.0\.0\.1:\d+$/);
    const vwc = await kc
      .makeApiClient(AdmissionregistrationV1Api)
      .readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION });
    assert.equal(vwc.webhooks?.[0]?.failurePolicy, 'Fail');
    assert.deepEqual(vwc.webhooks?.[0]?.rules?.[0]?.resources, [IDENTITY_RESOURCE.plural]);

    // The adapter sends to the Broker, whose address is the banner's; the Triggers deliver to the functions.
    const pid = run.child.pid!;
    const adapter = childNamed(pid, 'apiserver_receive_adapter');
    assert.ok(adapter, 'the ApiServerSource adapter runs under npm start');
    assert.equal(environOf(adapter, 'K_SINK'), brokerUrl);
    const custom = kc.makeApiClient(CustomObjectsApi);
    const broker = (await custom.getNamespacedCustomObject({
      group: 'eventing.knative.dev',
      version: 'v1',
      namespace: 'captf-system',
      plural: 'brokers',
      name: 'captf',
    })) as { status: { address: { url: string } } };
    assert.equal(broker.status.address.url, brokerUrl);
    const mirrorSyncUrl = /mirror-sync (http:\/\/\S+),/.exec(banner)![1]!;
    const trigger = (await custom.getNamespacedCustomObject({
      group: 'eventing.knative.dev',
      version: 'v1',
      namespace: 'captf-system',
      plural: 'triggers',
      name: 'captf-mirror-sync-ref-add',
    })) as { status: { subscriberUri: string } };
    assert.equal(trigger.status.subscriberUri, `${mirrorSyncUrl}/`);

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
    // The banner's prepare call works as printed: the manager's ServiceAccount and the shipped
    // binding exist, and a token for the audience captf-mirror-sync is accepted.
    const [, saName, saNs] = /kubectl create token (\S+) -n (\S+) --audience captf-mirror-sync/.exec(banner) ?? [];
    assert.ok(saName && saNs, 'the banner shows how to call prepare');
    const token = await serviceAccountToken(kc, { namespace: saNs, name: saName, audience: 'captf-mirror-sync' });
    const prod = prepareTarget(fx.consumer('prod', fx.inNamespace('team-a')));
    assert.equal((await postPrepare(mirrorSyncUrl, prod, `Bearer ${token}`)).status, 200);
    assert.equal((await postPrepare(mirrorSyncUrl, prod, undefined)).status, 401);
    // A few resync and status ticks (mtping, every 3 s) later, nothing new is printed for unchanged objects.
    const lines = () =>
      run
        .output()
        .split('\n')
        .filter((l) => /TerraformCluster team-a\/prod\s+mirrored/.test(l)).length;
    const before = lines();
    await new Promise((r) => setTimeout(r, 7000));
    assert.equal(lines(), before, 'an unchanged reconcile is not printed again');
    // Knative's processes said nothing worth a warning: their start-up noise is filtered.
    assert.deepEqual(knativeComplaints(run.output()), []);

    const children = childrenOf(pid);
    assert.ok(
      children.length >= 11,
      `etcd, apiserver, controller-manager, three functions, the adapter and the four data-plane processes run under it (${children.length})`,
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

describe("npm start prints what Knative's processes report", () => {
  it('pings arrive through mtping and the Broker; a dead function means filter errors, then a dead letter; a dead Broker means adapter errors', async () => {
    const run = start(['--dir', join(work, 'knative'), '--debug', '--resync', '2s', '--status', '2s']);
    const banner = await run.ready;
    const kubeconfig = /export KUBECONFIG=(\S+)/.exec(banner)![1]!;
    // Debug lines of the functions' summaries: each PingSource's ticks reach their function.
    await eventually(
      'a resync and a status refresh triggered by the PingSources',
      async () =>
        /mirror-sync\s+resync\s+consumers=/.test(run.output()) &&
        /identity-status\s+refresh\s+trigger=ping/.test(run.output()),
      30_000,
    );
    assert.deepEqual(knativeComplaints(run.output()), [], 'nothing to complain about yet');

    const pid = run.child.pid!;
    const mirrorSync = childNamed(pid, 'mirror-sync');
    assert.ok(mirrorSync, 'mirror-sync runs under npm start');
    process.kill(mirrorSync, 'SIGKILL');
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfig);
    const core = kc.makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: 'nobody-listens' } } });
    await eventually(
      "the filter's error about the failed delivery",
      async () => /events\s+broker-filter\s+error: failed to send event/.test(run.output()),
      30_000,
    );
    // The manifests' delivery: 5 retries, 1 + 2 + 4 + 8 + 16 s apart, then the dead-letter sink.
    await eventually(
      'the dead letter of the namespace event',
      async () =>
        /dead-letters\s+Namespace nobody-listens\s+warn: dev\.knative\.apiserver\.ref\.add given up by Trigger captf-mirror-sync-ref-add to mirror-sync \(knativeerrorcode=\d+\)/.test(
          run.output(),
        ),
      90_000,
    );

    const ingress = childNamed(pid, 'broker-ingress');
    assert.ok(ingress, 'the Broker ingress runs under npm start');
    process.kill(ingress, 'SIGKILL');
    await core.patchNamespace({
      name: 'nobody-listens',
      body: [{ op: 'add', path: '/metadata/labels', value: { touched: 'yes' } }],
    });
    await eventually(
      "the adapter's error line",
      async () => /events\s+adapter captf-objects\s+error: failed to send cloudevent/.test(run.output()),
      60_000,
    );
    run.child.kill('SIGINT');
    assert.equal(await run.exited, 0);
  });
});

describe('npm start against a named cluster', () => {
  it('installs only when told: without --install it refuses and writes nothing; with it the Broker runs there, the webhook goes on exit (also when interrupted while starting) and the cluster stays; a cluster running Knative Eventing is refused', async () => {
    const cp = await startControlPlane({ dir: join(work, 'named'), log: () => undefined });
    planes.push(cp);
    const kc = new KubeConfig();
    kc.loadFromFile(cp.kubeconfigPath);
    const ext = kc.makeApiClient(ApiextensionsV1Api);
    const core = kc.makeApiClient(CoreV1Api);
    const state = join(work, 'named-state');

    const bare = start(['--kubeconfig', cp.kubeconfigPath, '--dir', state]);
    assert.equal(await bare.exited, 2);
    assert.match(bare.output(), /need --install: events flow through Knative's Broker/);
    assert.equal((await ext.listCustomResourceDefinition()).items.length, 0, 'no CRD was installed');

    // A cluster that runs Knative Eventing (its controller's Deployment is there) is not ours to wire.
    await core.createNamespace({ body: { metadata: { name: 'knative-eventing' } } });
    const apps = kc.makeApiClient(AppsV1Api);
    const labels = { app: 'eventing-controller' };
    await apps.createNamespacedDeployment({
      namespace: 'knative-eventing',
      body: {
        metadata: { name: 'eventing-controller' },
        spec: {
          replicas: 0,
          selector: { matchLabels: labels },
          template: { metadata: { labels }, spec: { containers: [{ name: 'c', image: 'none' }] } },
        },
      },
    });
    const refused = start(['--kubeconfig', cp.kubeconfigPath, '--dir', state, '--install']);
    assert.equal(await refused.exited, 1);
    assert.match(
      refused.output(),
      /this cluster runs Knative Eventing \(deployment knative-eventing\/eventing-controller\)/,
    );
    assert.equal((await ext.listCustomResourceDefinition()).items.length, 0, 'still no CRD');
    await apps.deleteNamespacedDeployment({ namespace: 'knative-eventing', name: 'eventing-controller' });

    // --install on a cluster on this machine: CRDs, the Broker and its objects, and the webhook,
    // which is removed on exit (left behind, failurePolicy Fail would block every identity write).
    const run = start(['--kubeconfig', cp.kubeconfigPath, '--dir', state, '--install']);
    const banner = await run.ready;
    assert.match(banner, /webhook registered/);
    assert.match(banner, /events: Knative's ApiServerSource adapter → Broker captf/);
    assert.ok(banner.includes(`export KUBECONFIG=${cp.kubeconfigPath}`));
    const adm = kc.makeApiClient(AdmissionregistrationV1Api);
    await adm.readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION });
    await applyExamples(kc);
    await eventually('the mirror in team-a', async () =>
      /mirror-sync\s+TerraformCluster team-a\/prod\s+mirrored/.test(run.output()),
    );
    run.child.kill('SIGINT');
    assert.equal(await run.exited, 0);
    assert.doesNotMatch(run.output(), /and the control plane/);
    await adm.readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION }).then(
      () => assert.fail('the webhook configuration was removed on exit'),
      (e: unknown) => assert.ok(isNotFound(e)),
    );
    // The cluster is still there and still has the mirror.
    await core.readNamespacedSecret({ namespace: 'team-a', name: 'captf-creds-aws-prod' });

    // Ctrl-C while it starts, after the webhook was registered: the start is undone, webhook included.
    const interrupted = start(['--kubeconfig', cp.kubeconfigPath, '--dir', state, '--install']);
    // Every step before it runs first (the functions from source among them): minutes under a full suite's load.
    await eventually(
      'the Broker to be starting',
      async () => /starting Knative's Broker/.test(interrupted.output()),
      240_000,
    );
    interrupted.child.kill('SIGINT');
    assert.equal(await interrupted.exited, 130, interrupted.output());
    await adm.readValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION }).then(
      () => assert.fail('an interrupted start left its webhook configuration behind'),
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
    const noCron = start(['--status', '45s']);
    assert.equal(await noCron.exited, 2);
    assert.match(noCron.output(), /--status 45s: every 45s cannot be a PingSource schedule/);
  });
});
