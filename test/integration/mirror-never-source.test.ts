/**
 * SPEC §3, §9, §10: a mirror is never a source. The attacks are replayed through the real API
 * server, on a control plane of this file's own: the identity CRD is first installed without
 * its reserved-prefix rule (as clusters had it before), so identities that name mirrors can be
 * stored — a launderer naming the operator identity's mirror, with a copy it made earlier, and
 * a squatter naming a mirror that does not exist yet. Then the shipped CRD is applied, and
 * mirror-sync, identity-status and the CRD's own rule must leave every one of them inert while
 * the operator's identity keeps working, and keeps its power to revoke.
 */
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  AdmissionregistrationV1Api,
  KubeConfig,
  PatchStrategy,
  RbacAuthorizationV1Api,
  setHeaderOptions,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { start as startAdmission } from '../../functions/admission/index.ts';
import { start as startIdentityStatus } from '../../functions/identity-status/index.ts';
import { start as startMirrorSync } from '../../functions/mirror-sync/index.ts';
import {
  API_VERSION,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, makeClients, type Clients } from '../../functions/lib/kube.ts';
import {
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  LABEL_MIRRORED,
  isCurrent,
  isOurs,
  mirrorName,
  sourceHash,
} from '../../functions/lib/mirror.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { startControlPlane, userKubeConfig, type ControlPlane } from '../../scripts/controlplane/controlplane.ts';
import { applyCRDs, loadCRDs } from '../../scripts/controlplane/crds.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { registerWebhook } from '../../scripts/system/webhook.ts';
import { prepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { eventually } from '../../scripts/lib/wait.ts';
import { apiServerEvent, pingEvent, postEvents } from '../helpers/events.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { postPrepare } from '../helpers/prepare.ts';
import {
  conditionOf,
  consumerEvent,
  createConsumer,
  getConsumer,
  getMirror,
  putIdentity,
} from '../helpers/mirror-sync.ts';

const dir = join(REPO_ROOT, '.local', `never-source-${process.pid}`);
const SECRET = sentinel();
const logs = [captureLogger('mirror-sync'), captureLogger('identity-status'), captureLogger('admission')];
let cp: ControlPlane;
let a: Clients;
let mirrorSync: FunctionHandle;
let identityStatus: FunctionHandle;
let admission: FunctionHandle;
let tenant: Clients;
const fns: FunctionHandle[] = [];

/** The shipped CRDs, with the identity CRD's rule on `spec.secretRef.name` taken out (as before it existed). */
function crdsWithoutRule(): V1CustomResourceDefinition[] {
  return loadCRDs().map((crd) => {
    if (crd.spec.names.kind !== IDENTITY_KIND) return crd;
    const copy = structuredClone(crd);
    const schema = copy.spec.versions[0]!.schema!.openAPIV3Schema!;
    const name = schema.properties!.spec!.properties!.secretRef!.properties!.name!;
    assert.ok(name.x_kubernetes_validations, 'the shipped CRD has the rule this file takes out');
    delete name.x_kubernetes_validations;
    return copy;
  });
}

const identity = async (name: string) =>
  (await a.custom.getClusterCustomObject({
    group: GROUP,
    version: VERSION,
    plural: IDENTITY_PLURAL,
    name,
  })) as TerraformClusterIdentity;

/** Sends events to mirror-sync and waits for its answer (200: the work is done). */
async function toMirrorSync(...events: Parameters<typeof postEvents>[1][]): Promise<void> {
  for (const e of events) {
    const r = await postEvents(`http://127.0.0.1:${mirrorSync.port}/`, e);
    assert.equal(r.status, 200, r.text);
  }
}

const identityEvent = (name: string) =>
  apiServerEvent(
    { apiVersion: API_VERSION, kind: IDENTITY_KIND, metadata: { name } },
    'ref',
    'update',
    IDENTITY_PLURAL,
  );

/** A mirror as mirror-sync would have written it for `identity` before the rule: the launderer's copy. */
async function launderedCopy(namespace: string, identityName: string, ownerUid: string): Promise<void> {
  const source = await a.core.readNamespacedSecret({ name: 'creds', namespace: 'ops' });
  await a.core.createNamespacedSecret({
    namespace,
    body: {
      metadata: {
        name: mirrorName(identityName),
        labels: { [LABEL_MIRRORED]: 'true', 'captf.io/managed': 'true' },
        annotations: { [ANNOTATION_IDENTITY]: identityName, [ANNOTATION_SOURCE_HASH]: sourceHash(source.data) },
        ownerReferences: [{ apiVersion: API_VERSION, kind: 'TerraformCluster', name: 'tenant', uid: ownerUid }],
      },
      type: 'Opaque',
      data: source.data,
    },
  });
}

before(async () => {
  cp = await startControlPlane({ dir, log: () => undefined });
  const kc = new KubeConfig();
  kc.loadFromFile(cp.kubeconfigPath);
  a = makeClients(kc);
  await applyCRDs(kc, crdsWithoutRule());
  for (const n of ['ops', 'team-a', 'team-b', 'team-c'])
    await a.core.createNamespace({ body: { metadata: { name: n } } });
  await a.core.createNamespacedSecret({
    namespace: 'ops',
    body: { metadata: { name: 'creds' }, stringData: { token: SECRET } },
  });
  const opts = (i: number) => ({ port: 0, host: '127.0.0.1', kubeconfig: kc, logger: logs[i]!.logger, env: {} });
  mirrorSync = await startMirrorSync(opts(0));
  identityStatus = await startIdentityStatus(opts(1));
  const { leaf, caPem } = await createWebhookPair(dir, 'captf-never-source-ca');
  admission = await startAdmission({
    ...opts(2),
    env: { CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
  });
  fns.push(mirrorSync, identityStatus, admission);
  await registerWebhook(kc, { url: `https://127.0.0.1:${admission.port}`, caBundlePem: caPem });
  // A tenant admin: may read Secrets in team-a (so also the mirror there) and manage identities.
  const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
  await rbac.createClusterRole({
    body: {
      metadata: { name: 'identity-editor' },
      rules: [{ apiGroups: [GROUP], resources: [IDENTITY_PLURAL], verbs: ['get', 'create', 'update', 'patch'] }],
    },
  });
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name: 'tenant-identity-editor' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'identity-editor' },
      subjects: [{ kind: 'User', name: 'tenant-admin', apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
  await rbac.createNamespacedRole({
    namespace: 'team-a',
    body: { metadata: { name: 'read-secrets' }, rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }] },
  });
  await rbac.createNamespacedRoleBinding({
    namespace: 'team-a',
    body: {
      metadata: { name: 'tenant-reads-secrets' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'read-secrets' },
      subjects: [{ kind: 'User', name: 'tenant-admin', apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
  const tkc = new KubeConfig();
  tkc.loadFromFile(await userKubeConfig(dir, 'tenant-admin'));
  tenant = makeClients(tkc);
  await a.core.createNamespacedSecret({
    namespace: 'team-a',
    body: { metadata: { name: 'tenant-own' }, stringData: { token: 'tenant' } },
  });
});

after(async () => {
  for (const f of fns) await f.close().catch(() => undefined);
  await cp?.stop();
  rmSync(dir, { recursive: true, force: true });
  assertNoSecret(logs.flatMap((l) => l.lines).join('\n'), [SECRET], 'function logs');
});

describe('a mirror is never a source (SPEC §3)', () => {
  it('the operator identity mirrors into team-a', async () => {
    await putIdentity(a, 'aws-prod', { namespace: 'ops', name: 'creds' }, { list: ['team-a', 'team-c'] });
    const c = await createConsumer(a, 'team-a', 'prod', 'aws-prod');
    await toMirrorSync(consumerEvent(c));
    const m = await getMirror(a, 'team-a', 'aws-prod');
    assert.ok(m && isOurs(m, 'aws-prod', { namespace: 'ops', name: 'creds' }));
  });

  it('the webhook refuses a tenant laundering the mirror by create and by update, naming whose mirror it is', async () => {
    // The tenant may read team-a's Secrets, mirror included: a SubjectAccessReview alone would pass.
    await tenant.core.readNamespacedSecret({ name: mirrorName('aws-prod'), namespace: 'team-a' });
    const body = (name: string, secret: string) => ({
      apiVersion: API_VERSION,
      kind: IDENTITY_KIND,
      metadata: { name },
      spec: { secretRef: { namespace: 'team-a', name: secret }, allowedNamespaces: { selector: {} } },
    });
    const refusal = async (p: Promise<unknown>) => {
      const err = await p.then(
        () => undefined,
        (e: unknown) => e,
      );
      return err === undefined ? undefined : { code: apiStatus(err), body: String((err as { body?: unknown }).body) };
    };
    // The API server picks the webhook configuration up within moments: until then a create gets through.
    const created = await eventually('the webhook to refuse the launderer', async () => {
      const r = await refusal(
        tenant.custom.createClusterCustomObject({
          group: GROUP,
          version: VERSION,
          plural: IDENTITY_PLURAL,
          body: body('aws-copy-new', mirrorName('aws-prod')),
        }),
      );
      if (!r)
        await a.custom.deleteClusterCustomObject({
          group: GROUP,
          version: VERSION,
          plural: IDENTITY_PLURAL,
          name: 'aws-copy-new',
        });
      return r;
    });
    assert.equal(created.code, 422);
    assert.match(created.body, /denied the request.*reserved for the mirrors.*aws-prod/);
    // Its own identity on its own Secret is fine; moving it onto the mirror is not.
    await tenant.custom.createClusterCustomObject({
      group: GROUP,
      version: VERSION,
      plural: IDENTITY_PLURAL,
      body: body('tenant-id', 'tenant-own'),
    });
    const current = await identity('tenant-id');
    const updated = await refusal(
      tenant.custom.replaceClusterCustomObject({
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        name: 'tenant-id',
        body: { ...body('tenant-id', mirrorName('aws-prod')), metadata: current.metadata },
      }),
    );
    assert.equal(updated?.code, 422);
    assert.match(updated!.body, /reserved for the mirrors.*aws-prod/);
  });

  it('identities stored before the rule (around the webhook) are inert; the shipped CRD then refuses new ones', async () => {
    await a.kc
      .makeApiClient(AdmissionregistrationV1Api)
      .deleteValidatingWebhookConfiguration({ name: 'captf-credentials-local' });
    // The launderer, with a copy it got before the rule, used in team-c; and a squatter on a
    // mirror name nobody uses yet.
    await putIdentity(a, 'aws-copy', { namespace: 'team-a', name: mirrorName('aws-prod') }, { selector: {} });
    await putIdentity(a, 'squat', { namespace: 'team-b', name: mirrorName('aws-dev') }, { list: ['team-b'] });
    const victim = await createConsumer(a, 'team-c', 'tenant', 'aws-copy');
    await launderedCopy('team-c', 'aws-copy', victim.metadata.uid!);
    await applyCRDs(a.kc, loadCRDs());

    await toMirrorSync(pingEvent(), identityEvent('aws-copy'), consumerEvent(victim));
    assert.equal(await getMirror(a, 'team-c', 'aws-copy'), undefined, 'the laundered copy is deleted');
    const got = await getConsumer(a, 'team-c', 'tenant');
    assert.equal(conditionOf(got, 'CredentialsMirrored')?.reason, 'SourceIsMirror');
    assert.equal(conditionOf(got, 'IdentityAllowed')?.status, 'True');
    assert.match(conditionOf(got, 'CredentialsMirrored')!.message, /aws-copy is inert/);
    // The provider's manager is told why no Job may start there.
    const manager = await prepareCaller(a.kc, { namespace: 'ops', name: 'captf-controller-manager', suffix: 'm' });
    const prep = await postPrepare(
      `http://127.0.0.1:${mirrorSync.port}`,
      { apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: 'team-c', name: 'tenant' },
      manager,
    );
    assert.equal(prep.status, 409, prep.text);
    assert.equal(prep.body.reason, 'SourceIsMirror');
    assert.equal(prep.body.sourceHash, undefined);
    // The operator's consumer is untouched: the launderer does not make its mirror "not ours".
    const prod = await getConsumer(a, 'team-a', 'prod');
    assert.equal(conditionOf(prod, 'CredentialsMirrored')?.reason, 'Mirrored');
    const m = (await getMirror(a, 'team-a', 'aws-prod'))!;
    assert.ok(isCurrent(m, sourceHash((await a.core.readNamespacedSecret({ name: 'creds', namespace: 'ops' })).data)));

    assert.equal((await postEvents(`http://127.0.0.1:${identityStatus.port}/`, pingEvent('status'))).status, 200);
    for (const [name, reason] of [
      ['aws-copy', 'SecretIsMirror'],
      ['squat', 'SecretIsMirror'],
      ['aws-prod', 'SecretFound'],
    ] as const) {
      const ready = (await identity(name)).status?.conditions?.find((c) => c.type === 'Ready');
      assert.equal(ready?.reason, reason, name);
    }
  });

  it('the squatter takes no mirror name first: a later identity gets its mirror, and keeps it across a resync', async () => {
    await putIdentity(a, 'aws-dev', { namespace: 'ops', name: 'creds' }, { list: ['team-b'] });
    const c = await createConsumer(a, 'team-b', 'dev', 'aws-dev');
    await toMirrorSync(consumerEvent(c), identityEvent('squat'), pingEvent());
    const m = await getMirror(a, 'team-b', 'aws-dev');
    assert.ok(m && isOurs(m, 'aws-dev', { namespace: 'ops', name: 'creds' }));
    assert.equal(conditionOf(await getConsumer(a, 'team-b', 'dev'), 'CredentialsMirrored')?.reason, 'Mirrored');
  });

  it('the operator still revokes: narrowing deletes the mirror another identity names', async () => {
    await putIdentity(a, 'aws-prod', { namespace: 'ops', name: 'creds' }, { list: ['team-c'] });
    await toMirrorSync(identityEvent('aws-prod'));
    assert.equal(await getMirror(a, 'team-a', 'aws-prod'), undefined);
    assert.equal(conditionOf(await getConsumer(a, 'team-a', 'prod'), 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
  });

  it('the CRD rule ratchets: an inert identity may be narrowed and lose its finalizers, never moved onto a mirror', async () => {
    const patch = (body: object) =>
      a.custom.patchClusterCustomObject(
        { group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: 'aws-copy', body },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
    await patch({ metadata: { finalizers: ['captf.io/test'] } });
    await patch({ spec: { allowedNamespaces: { list: [] } } });
    await patch({ metadata: { finalizers: null, labels: { narrowed: 'true' } } });
    const err = await patch({ spec: { secretRef: { name: mirrorName('aws-dev') } } }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.equal(apiStatus(err), 422, 'moving onto another mirror is refused by CEL alone');
    assert.match(String((err as { body?: unknown }).body), /reserved for mirrors.*aws-dev/);
    const created = await a.custom
      .createClusterCustomObject({
        group: GROUP,
        version: VERSION,
        plural: IDENTITY_PLURAL,
        body: {
          apiVersion: API_VERSION,
          kind: IDENTITY_KIND,
          metadata: { name: 'late-copy' },
          spec: { secretRef: { namespace: 'team-c', name: mirrorName('aws-prod') } },
        },
      })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    assert.equal(apiStatus(created), 422, 'the CRD refuses a new one with no webhook at all');
    await eventually(
      'nothing left of the launderer',
      async () => (await getMirror(a, 'team-c', 'aws-copy')) === undefined,
    );
  });
});
