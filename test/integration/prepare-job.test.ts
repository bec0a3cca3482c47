/**
 * SPEC §5 + §11, the prepare-then-Job flow: this test plays the provider's manager. It calls
 * mirror-sync's `POST /prepare` with its ServiceAccount's token for audience
 * `captf-mirror-sync` (bound to the shipped prepare role), and only on 200 creates a Terraform Job built with the
 * delivery fragment, as a user who may create Jobs but cannot read Secrets. A prepare for a
 * deleting object whose namespace is no longer allowed refuses, the object shows
 * `ApplyJobSucceeded=False/IdentityNotAllowed`, and the mirror the earlier Job used is gone.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { BatchV1Api, RbacAuthorizationV1Api, type V1Job } from '@kubernetes/client-node';
import type { Consumer } from '../../functions/lib/api.ts';
import { CREDENTIALS_VOLUME, jobWithCredentials } from '../../functions/lib/delivery.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { ANNOTATION_SOURCE_HASH, mirrorName } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { asUser, eventually, suffix } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { manager, postPrepare, prepareTarget } from '../helpers/prepare.ts';
import { UNSIGNED_EVENTS } from '../helpers/events.ts';

const w = fx.world('prepjob');
const a = w.clients;
const log = captureLogger('mirror-sync');
const SECRET_VALUES = [sentinel(), sentinel()];
const answers: string[] = [];
const SOURCE = 'cloud-creds';
const FINALIZER = 'captf.io/test-manager';
let sourceNamespace: string;
let fn: FunctionHandle;
let url: string;
let caller: PrepareCaller;

before(async () => {
  sourceNamespace = await w.namespace();
  await w.create(
    fx.sourceSecret(
      SOURCE,
      fx.inNamespace(sourceNamespace),
      fx.data({ AWS_SECRET_ACCESS_KEY: SECRET_VALUES[0]!, TF_VAR_token: SECRET_VALUES[1]! }),
    ),
  );
  fn = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: log.logger, env: UNSIGNED_EVENTS });
  url = `http://127.0.0.1:${fn.port}`;
  caller = await manager(w);
});
after(async () => {
  await fn?.close();
  const said = [...log.lines, ...answers].join('\n');
  assertNoSecret(said, SECRET_VALUES, 'mirror-sync logs and prepare answers');
  assert.ok(!caller || !said.includes(caller.token), "the manager's token appears in no log line or answer");
});

/** The manager's call: POST /prepare for one consumer, with its audience-bound token. */
async function prepare(c: Consumer): Promise<{ status: number; body: Record<string, string> }> {
  const r = await postPrepare(url, prepareTarget(c), caller);
  answers.push(r.text);
  return r;
}

/**
 * A fresh namespace with consumer `name` naming a fresh identity that allows it; `allowing`
 * builds that identity allowing the namespaces given (for `w.put`).
 */
async function key(name: string, ...mods: fx.Modifier<Consumer>[]) {
  const n = await w.namespace();
  const id = w.name('id');
  const allowing = (...namespaces: string[]) =>
    fx.identity(id, fx.secretRef(sourceNamespace, SOURCE), fx.allowList(...namespaces));
  await w.create(allowing(n));
  const c = await w.create(fx.consumer(name, fx.inNamespace(n), fx.identityRef(id), ...mods));
  return { n, id, c, allowing, mirror: fx.mirrorOf(id, fx.inNamespace(n)) };
}

/** The manager's Job for a consumer and an action, before credentials are added. */
const jobFor = (c: Consumer, action: 'apply' | 'destroy'): V1Job =>
  fx.terraformJob(`${c.metadata.name}-${action}`, action, fx.inNamespace(c.metadata.namespace!));

/** A user that may create and read Jobs in `namespace` and nothing else (no Secrets). */
async function managerIn(namespace: string): Promise<BatchV1Api> {
  const user = `manager-${suffix()}`;
  const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
  await rbac.createNamespacedRole({
    namespace,
    body: {
      metadata: { name: 'terraform-jobs' },
      rules: [{ apiGroups: ['batch'], resources: ['jobs'], verbs: ['create', 'get'] }],
    },
  });
  await rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name: 'terraform-jobs' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'terraform-jobs' },
      subjects: [{ kind: 'User', name: user, apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
  const u = await asUser(user);
  await assert.rejects(
    u.core.readNamespacedSecret({ name: 'anything', namespace }),
    (e: unknown) => apiStatus(e) === 403,
    'the manager cannot read Secrets',
  );
  return u.kc.makeApiClient(BatchV1Api);
}

/** Creates the Job only after the RBAC above is in effect (a dry run first, retried). */
async function createJob(batch: BatchV1Api, job: V1Job): Promise<V1Job> {
  const namespace = job.metadata!.namespace!;
  await eventually(
    'the manager to be allowed to create Jobs',
    async () => !!(await batch.createNamespacedJob({ namespace, body: job, dryRun: 'All' })),
  );
  return batch.createNamespacedJob({ namespace, body: job });
}

describe('prepare, then the Job (SPEC §5, §11)', () => {
  it('a Job created after prepare answered 200 references the mirror prepare vouched for, current and owned', async () => {
    const { n, id, c, mirror } = await key('cluster-a');
    const batch = await managerIn(n);

    const p = await prepare(c);
    assert.equal(p.status, 200, JSON.stringify(p.body));
    assert.equal(p.body.mirror, mirrorName(id));
    const ref = c.spec?.identityRef?.name; // the manager reads the identity from the consumer
    assert.equal(ref, id);
    const job = await createJob(batch, jobWithCredentials(jobFor(c, 'apply'), ref, 'terraform'));

    const back = await batch.readNamespacedJob({ name: job.metadata!.name!, namespace: n });
    const pod = back.spec!.template.spec!;
    const secretName = pod.volumes!.find((v) => v.name === CREDENTIALS_VOLUME)!.secret!.secretName!;
    assert.equal(secretName, p.body.mirror);
    assert.equal(pod.containers[0]!.envFrom![0]!.secretRef!.name, p.body.mirror);
    const found = (await w.read(mirror))!;
    assert.equal(found.metadata!.name, secretName, 'the Secret the Job references exists in its namespace');
    assert.equal(found.metadata!.annotations![ANNOTATION_SOURCE_HASH], p.body.sourceHash);
    assert.ok(
      found.metadata!.ownerReferences!.some((o) => o.uid === c.metadata.uid),
      'owned by the consumer',
    );

    // The job controller creates the Pod with the same references (it never starts: no kubelet).
    const jobPod = await eventually(
      'the job controller to create the Pod',
      async () =>
        (
          await a.core.listNamespacedPod({
            namespace: n,
            labelSelector: `batch.kubernetes.io/job-name=${job.metadata!.name}`,
          })
        ).items[0],
      120_000,
    );
    assert.equal(jobPod.spec!.volumes!.find((v) => v.name === CREDENTIALS_VOLUME)!.secret!.secretName, p.body.mirror);
  });

  it('a destroy waits while the namespace is not allowed: prepare refuses, the object says why, no mirror is left; allowing it again lets the destroy Job start', async () => {
    const { n, id, c, allowing, mirror } = await key('cluster-b', fx.finalizers(FINALIZER));
    w.onCleanup(() => dropFinalizer(c));
    const batch = await managerIn(n);

    assert.equal((await prepare(c)).status, 200);
    await createJob(batch, jobWithCredentials(jobFor(c, 'apply'), id, 'terraform'));

    // The operator narrows the identity, then the tenant deletes the cluster: the manager must run a destroy.
    await w.put(allowing());
    await w.delete(c);
    const refused = await prepare(c);
    assert.equal(refused.status, 403);
    assert.equal(refused.body.reason, 'IdentityNotAllowed');
    // The manager creates no Job on a refusal; the object tells the user why the destroy waits.
    const deleting = (await w.read(c))!;
    assert.ok(deleting.metadata.deletionTimestamp);
    assert.equal(fx.conditionOf(deleting, 'ApplyJobSucceeded')?.status, 'False');
    assert.equal(fx.conditionOf(deleting, 'ApplyJobSucceeded')?.reason, 'IdentityNotAllowed');
    assert.equal(fx.conditionOf(deleting, 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
    // The mirror the apply Job referenced is gone, so that Job's Pod could no longer start with credentials.
    assert.equal(await w.read(mirror), undefined);

    // The way out: the operator allows the namespace again; prepare succeeds and the destroy Job is created.
    await w.put(allowing(n));
    const again = await prepare(c);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    const destroy = await createJob(batch, jobWithCredentials(jobFor(c, 'destroy'), id, 'terraform'));
    assert.equal(destroy.spec!.template.spec!.containers[0]!.envFrom![0]!.secretRef!.name, again.body.mirror);
    assert.ok(await w.read(mirror), 'the mirror the destroy Job references exists');
    assert.equal(fx.conditionOf((await w.read(c))!, 'ApplyJobSucceeded'), undefined);
  });

  it('the other way out: the manager abandons the infrastructure (drops its finalizer) and no credentials stay behind', async () => {
    const { c, allowing, mirror } = await key('cluster-c', fx.finalizers(FINALIZER));
    assert.equal((await prepare(c)).status, 200);
    await w.put(allowing());
    await w.delete(c);
    assert.equal((await prepare(c)).body.reason, 'IdentityNotAllowed');

    await dropFinalizer(c);
    await eventually('the consumer to be gone', async () => (await w.read(c)) === undefined);
    // Another file's resync (cluster-wide, from lists made before the revocation) may create
    // the mirror again for a moment; its re-check after creating deletes it: the end state counts.
    await eventually('no mirror left', async () => (await w.read(mirror)) === undefined);
    assert.equal((await prepare(c)).body.reason, 'ObjectNotFound');
  });
});

/** Removes the manager's finalizer (what the manager does after a destroy, or to abandon). */
async function dropFinalizer(c: Consumer): Promise<void> {
  const o = await w.read(c);
  if (!o?.metadata.finalizers?.includes(FINALIZER)) return;
  await w.put({ ...o, metadata: { ...o.metadata, finalizers: o.metadata.finalizers.filter((f) => f !== FINALIZER) } });
}
