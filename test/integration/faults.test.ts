/**
 * Faults, on a control plane of this file's own so no other file is
 * disturbed: while a stream of 500 events flows from the real ApiServerSource adapter
 * through Knative's Broker (the manifests' retries) to mirror-sync running as a process,
 * (a) kube-apiserver is stopped for 10 s and started again, (b) etcd likewise, (c) mirror-sync
 * is SIGKILLed mid-burst and a new one started on the same port. Throughout, a watch checks
 * that no mirror is ever half-written (absent, or complete with its hash); after each fault
 * the functions recover without a restart (they never crashed), and after one resync the
 * invariant holds. During the API server outage the webhook fails closed saying it could not
 * check, and identity-status writes nothing wrong.
 */
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Watch, type KubeConfig, type V1Secret } from '@kubernetes/client-node';
import { TERRAFORM_CLUSTER } from '../../functions/lib/api.ts';
import { makeClients, type Clients } from '../../functions/lib/kube.ts';
import { ANNOTATION_SOURCE_HASH, LABEL_MIRRORED, sourceHash } from '../../functions/lib/mirror.ts';
import { consumerObjects, identities } from '../../functions/lib/objects.ts';
import { freePort } from '../../scripts/lib/ports.ts';
import type { FunctionProcess } from '../../scripts/lib/process.ts';
import { eventually } from '../../scripts/lib/wait.ts';
import { startSystem, type RunningSystem } from '../../scripts/system/system.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { pingEvent, postEvents } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { invariantViolations } from '../helpers/invariant.ts';

const dir = join(REPO_ROOT, '.local', `faults-${process.pid}`);
const NAMESPACES = ['team-0', 'team-1', 'team-2', 'team-3'];
/** identity-status's log lines, parsed. */
const statusLog: Record<string, unknown>[] = [];
let system: RunningSystem;
let a: Clients;
let consumers: ReturnType<typeof consumerObjects>;
let mirrorSync: FunctionProcess;
const halfWritten: string[] = [];
let stopWatch: (() => void) | undefined;

/** Records every mirror seen whose data and hash annotation disagree (a half-written mirror). */
async function watchMirrors(kc: KubeConfig): Promise<void> {
  const req = await new Watch(kc).watch(
    '/api/v1/secrets',
    { labelSelector: `${LABEL_MIRRORED}=true` },
    (type: string, s: V1Secret) => {
      if (type === 'DELETED') return;
      const hash = s.metadata?.annotations?.[ANNOTATION_SOURCE_HASH];
      if (hash !== sourceHash(s.data)) halfWritten.push(`${s.metadata?.namespace}/${s.metadata?.name}`);
    },
    () => undefined,
  );
  stopWatch = () => req.abort();
}

before(async () => {
  // mirror-sync on a fixed port: the Broker's Trigger names that URL, and a restarted one must take it over.
  const port = String(await freePort());
  system = await startSystem({
    dir,
    progress: () => undefined,
    functions: 'source',
    events: 'broker',
    env: { 'mirror-sync': { PORT: port }, admission: { CAPTF_ADMISSION_PLAIN_HTTP: 'true' } },
    onRawLine: (c, l) => {
      if (c !== 'identity-status' || !l.startsWith('{')) return;
      statusLog.push(JSON.parse(l) as Record<string, unknown>);
    },
  });
  mirrorSync = system.functions['mirror-sync'];
  // Signed before any fault, as the Broker's filter holds its tokens: no token can be minted while the API server is down.
  for (const fn of ['mirror-sync', 'identity-status'] as const) await system.sign(fn);
  a = makeClients(system.kc);
  consumers = consumerObjects(a, TERRAFORM_CLUSTER);
  for (const n of ['ops', ...NAMESPACES]) await a.core.createNamespace({ body: fx.namespace(n) });
  await a.core.createNamespacedSecret({ namespace: 'ops', body: fx.sourceSecret('creds', fx.inNamespace('ops')) });
  await identities(a).create(fx.identity('id-a', fx.secretRef('ops', 'creds'), fx.allowList(...NAMESPACES)));
  await watchMirrors(system.kc);
});

after(async () => {
  stopWatch?.();
  await system?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** Creates `count` consumers (one add event each, plus our status writes' echoes), a few at a time. */
async function stream(prefix: string, count: number): Promise<void> {
  for (let i = 0; i < count; i += 5) {
    await Promise.all(
      Array.from({ length: Math.min(5, count - i) }, (_, j) =>
        consumers
          .create(
            fx.consumer(
              `${prefix}-${i + j}`,
              fx.inNamespace(NAMESPACES[(i + j) % NAMESPACES.length]!),
              fx.identityRef('id-a'),
            ),
          )
          .catch(() => {
            // The API server may be down for a moment; the stream goes on.
          }),
      ),
    );
  }
}

/** A PingSource tick's CloudEvent, posted straight to a function, signed as its Trigger signs it. */
const postPing = async (url: string, fn: 'mirror-sync' | 'identity-status') =>
  postEvents(`${url}/`, pingEvent(), 'binary', undefined, await system.sign(fn));

/** One resync (answered 200: its work is done), then the invariant. */
async function resyncAndCheck(): Promise<void> {
  const r = await eventually('a resync answered 200', async () => {
    const res = await postPing(mirrorSync.url, 'mirror-sync').catch(() => undefined);
    return res?.status === 200 ? res : undefined;
  });
  assert.equal(r.status, 200);
  // Deliveries still being retried may reconcile meanwhile; they only ever converge.
  let violations: string[] = [];
  await eventually(
    'the invariant',
    async () => {
      violations = await invariantViolations(a, NAMESPACES);
      return violations.length === 0;
    },
    15_000,
  ).catch(() => assert.deepEqual(violations, []));
}

/** A stream of about 500 events with `fault` injected once it is under way. */
async function underFault(prefix: string, fault: () => Promise<void>): Promise<void> {
  const streaming = stream(prefix, 250);
  await new Promise((r) => setTimeout(r, 1000));
  await fault();
  await streaming;
  await resyncAndCheck();
  assert.deepEqual(halfWritten, [], 'no mirror was ever seen half-written');
}

/** What must hold while the API server is down: admission fails closed, identity-status answers 5xx. */
async function checkDuringOutage(): Promise<void> {
  const review = await fetch(`${system.functions.admission.url}/validate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid: 'u-1',
        operation: 'CREATE',
        userInfo: { username: 'alice' },
        object: fx.identity('x', fx.secretRef('ops', 'creds')),
      },
    }),
  });
  const answer = (await review.json()) as { response: { allowed: boolean; status?: { message: string } } };
  assert.equal(answer.response.allowed, false, 'fails closed');
  assert.match(answer.response.status!.message, /could not check/);
  // identity-status during the outage: its ping fails and it writes nothing.
  const ping = await postPing(system.functions['identity-status'].url, 'identity-status');
  assert.ok(ping.status >= 500, `identity-status answers ${ping.status} while the API server is down`);
}

describe('faults under a stream of events through the Broker', () => {
  it('kube-apiserver stopped for 10 s: webhook fails closed, identity-status writes nothing wrong, all recovers', async () => {
    const cp = system.controlPlane!;
    await underFault('api', async () => {
      await cp.stopComponent('kube-apiserver');
      // Started again whatever the checks say, so a failure here does not fail the next tests too.
      const outage = new Promise((r) => setTimeout(r, 10_000));
      try {
        await checkDuringOutage();
      } finally {
        await outage;
        await cp.startComponent('kube-apiserver');
      }
    });
    const wrong = statusLog.filter((e) => e.message === 'identity refreshed' && e.ready === 'False');
    assert.ok(statusLog.length > 0, "identity-status's log lines were read");
    assert.deepEqual(wrong, [], 'no Ready=False because a read failed');
    assert.ok(!mirrorSync.child.killed && mirrorSync.child.exitCode === null, 'mirror-sync never crashed');
  });

  it('etcd stopped for 10 s: all recovers, the invariant holds after one resync', async () => {
    await underFault('etcd', async () => {
      await system.controlPlane!.stopComponent('etcd');
      await new Promise((r) => setTimeout(r, 10_000));
      await system.controlPlane!.startComponent('etcd');
    });
    assert.equal(mirrorSync.child.exitCode, null, 'mirror-sync never crashed');
  });

  it('mirror-sync SIGKILLed mid-burst and a new one started: the invariant holds after one resync', async () => {
    await underFault('kill', async () => {
      mirrorSync.child.kill('SIGKILL');
      await mirrorSync.exited;
      mirrorSync = await system.startFunction('mirror-sync');
    });
  });
});
