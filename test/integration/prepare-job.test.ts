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
import { API_VERSION, GROUP, VERSION, type Consumer } from '../../functions/lib/api.ts';
import { CREDENTIALS_VOLUME, jobWithCredentials } from '../../functions/lib/delivery.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { ANNOTATION_SOURCE_HASH, mirrorName } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { admin, asUser, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { manager, postPrepare } from '../helpers/prepare.ts';
import {
  conditionOf,
  createConsumer,
  deleteConsumer,
  deleteIdentity,
  getConsumer,
  getMirror,
  putIdentity,
} from '../helpers/mirror-sync.ts';

const a = admin();
const ns = namespaces('prepjob');
const log = captureLogger('mirror-sync');
const SECRET_VALUES = [sentinel(), sentinel()];
const answers: string[] = [];
const source = { name: 'cloud-creds', namespace: '' };
const FINALIZER = 'captf.io/test-manager';
let fn: FunctionHandle;
let url: string;
let caller: PrepareCaller;

before(async () => {
  source.namespace = await ns.create();
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  await a.core.createNamespacedSecret({
    namespace: source.namespace,
    body: {
      metadata: { name: source.name },
      data: { AWS_SECRET_ACCESS_KEY: b64(SECRET_VALUES[0]!), TF_VAR_token: b64(SECRET_VALUES[1]!) },
    },
  });
  fn = await start({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: log.logger, env: {} });
  url = `http://127.0.0.1:${fn.port}`;
  caller = await manager(ns);
});
after(async () => {
  await fn?.close();
  const said = [...log.lines, ...answers].join('\n');
  assertNoSecret(said, SECRET_VALUES, 'mirror-sync logs and prepare answers');
  assert.ok(!caller || !said.includes(caller.token), "the manager's token appears in no log line or answer");
});

/** The manager's call: POST /prepare for one consumer, with its audience-bound token. */
async function prepare(c: Consumer): Promise<{ status: number; body: Record<string, string> }> {
  const r = await postPrepare(
    url,
    { apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: c.metadata.namespace, name: c.metadata.name },
    caller,
  );
  answers.push(r.text);
  return r;
}

/** The manager's Job for a consumer and an action, before credentials are added. */
const terraformJob = (c: Consumer, action: 'apply' | 'destroy'): V1Job => ({
  apiVersion: 'batch/v1',
  kind: 'Job',
  metadata: { name: `${c.metadata.name}-${action}`, namespace: c.metadata.namespace },
  spec: {
    backoffLimit: 0,
    template: {
      spec: {
        restartPolicy: 'Never',
        securityContext: { runAsNonRoot: true, runAsUser: 65532 },
        containers: [
          {
            name: 'terraform',
            image: 'registry.example/captf-terraform:1.0',
            command: ['captf-runner', '--', 'terraform', action, '-auto-approve', '-input=false'],
            env: [
              { name: 'TF_IN_AUTOMATION', value: '1' },
              { name: 'TF_INPUT', value: '0' },
              { name: 'KUBE_NAMESPACE', value: c.metadata.namespace! },
            ],
          },
        ],
      },
    },
  },
});

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
    const n = await ns.create();
    const identity = `id-${suffix()}`;
    ns.onCleanup(() => deleteIdentity(a, identity));
    await putIdentity(a, identity, source, { list: [n] });
    const c = await createConsumer(a, n, 'cluster-a', identity);
    const batch = await managerIn(n);

    const p = await prepare(c);
    assert.equal(p.status, 200, JSON.stringify(p.body));
    assert.equal(p.body.mirror, mirrorName(identity));
    const identityRef = c.spec?.identityRef?.name; // the manager reads the identity from the consumer
    assert.equal(identityRef, identity);
    const job = await createJob(batch, jobWithCredentials(terraformJob(c, 'apply'), identityRef, 'terraform'));

    const back = await batch.readNamespacedJob({ name: job.metadata!.name!, namespace: n });
    const pod = back.spec!.template.spec!;
    const secretName = pod.volumes!.find((v) => v.name === CREDENTIALS_VOLUME)!.secret!.secretName!;
    assert.equal(secretName, p.body.mirror);
    assert.equal(pod.containers[0]!.envFrom![0]!.secretRef!.name, p.body.mirror);
    const mirror = (await getMirror(a, n, identity))!;
    assert.equal(mirror.metadata!.name, secretName, 'the Secret the Job references exists in its namespace');
    assert.equal(mirror.metadata!.annotations![ANNOTATION_SOURCE_HASH], p.body.sourceHash);
    assert.ok(
      mirror.metadata!.ownerReferences!.some((o) => o.uid === c.metadata.uid),
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
    const n = await ns.create();
    const identity = `id-${suffix()}`;
    ns.onCleanup(() => deleteIdentity(a, identity));
    await putIdentity(a, identity, source, { list: [n] });
    const c = await createConsumer(a, n, 'cluster-b', identity, 'TerraformCluster', { finalizers: [FINALIZER] });
    ns.onCleanup(() => dropFinalizer(n, 'cluster-b'));
    const batch = await managerIn(n);

    assert.equal((await prepare(c)).status, 200);
    await createJob(batch, jobWithCredentials(terraformJob(c, 'apply'), identity, 'terraform'));

    // The operator narrows the identity, then the tenant deletes the cluster: the manager must run a destroy.
    await putIdentity(a, identity, source, { list: [] });
    await deleteConsumer(a, n, 'cluster-b');
    const refused = await prepare(c);
    assert.equal(refused.status, 403);
    assert.equal(refused.body.reason, 'IdentityNotAllowed');
    // The manager creates no Job on a refusal; the object tells the user why the destroy waits.
    const deleting = await getConsumer(a, n, 'cluster-b');
    assert.ok(deleting.metadata.deletionTimestamp);
    assert.equal(conditionOf(deleting, 'ApplyJobSucceeded')?.status, 'False');
    assert.equal(conditionOf(deleting, 'ApplyJobSucceeded')?.reason, 'IdentityNotAllowed');
    assert.equal(conditionOf(deleting, 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
    // The mirror the apply Job referenced is gone, so that Job's Pod could no longer start with credentials.
    assert.equal(await getMirror(a, n, identity), undefined);

    // The way out: the operator allows the namespace again; prepare succeeds and the destroy Job is created.
    await putIdentity(a, identity, source, { list: [n] });
    const again = await prepare(c);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    const destroy = await createJob(batch, jobWithCredentials(terraformJob(c, 'destroy'), identity, 'terraform'));
    assert.equal(destroy.spec!.template.spec!.containers[0]!.envFrom![0]!.secretRef!.name, again.body.mirror);
    assert.ok(await getMirror(a, n, identity), 'the mirror the destroy Job references exists');
    assert.equal(conditionOf(await getConsumer(a, n, 'cluster-b'), 'ApplyJobSucceeded'), undefined);
  });

  it('the other way out: the manager abandons the infrastructure (drops its finalizer) and no credentials stay behind', async () => {
    const n = await ns.create();
    const identity = `id-${suffix()}`;
    ns.onCleanup(() => deleteIdentity(a, identity));
    await putIdentity(a, identity, source, { list: [n] });
    const c = await createConsumer(a, n, 'cluster-c', identity, 'TerraformCluster', { finalizers: [FINALIZER] });
    assert.equal((await prepare(c)).status, 200);
    await putIdentity(a, identity, source, { list: [] });
    await deleteConsumer(a, n, 'cluster-c');
    assert.equal((await prepare(c)).body.reason, 'IdentityNotAllowed');

    await dropFinalizer(n, 'cluster-c');
    await eventually(
      'the consumer to be gone',
      async () =>
        (await getConsumer(a, n, 'cluster-c').catch((e: unknown) =>
          apiStatus(e) === 404 ? undefined : Promise.reject(e),
        )) === undefined,
    );
    // Another file's resync (cluster-wide, from lists made before the revocation) may create
    // the mirror again for a moment; its re-check after creating deletes it: the end state counts.
    await eventually('no mirror left', async () => (await getMirror(a, n, identity)) === undefined);
    assert.equal((await prepare(c)).body.reason, 'ObjectNotFound');
  });
});

/** Removes the manager's finalizer (what the manager does after a destroy, or to abandon). */
async function dropFinalizer(namespace: string, name: string): Promise<void> {
  const o = await getConsumer(a, namespace, name).catch(() => undefined);
  if (!o?.metadata.finalizers?.length) return;
  o.metadata.finalizers = o.metadata.finalizers.filter((f) => f !== FINALIZER);
  await a.custom.replaceNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    plural: 'terraformclusters',
    namespace,
    name,
    body: o,
  });
}
