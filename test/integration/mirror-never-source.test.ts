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
  RbacAuthorizationV1Api,
  type V1CustomResourceDefinition,
} from '@kubernetes/client-node';
import { start as startAdmission } from '../../functions/admission/index.ts';
import { start as startIdentityStatus } from '../../functions/identity-status/index.ts';
import { start as startMirrorSync } from '../../functions/mirror-sync/index.ts';
import {
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  type Consumer,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, ignoreNotFound, makeClients, retryOnConflict, type Clients } from '../../functions/lib/kube.ts';
import {
  ANNOTATION_IDENTITY,
  ANNOTATION_SOURCE_HASH,
  LABEL_MIRRORED,
  isCurrent,
  isOurs,
  mirrorName,
  sourceHash,
} from '../../functions/lib/mirror.ts';
import { consumerObjects, identities, type CustomObjects } from '../../functions/lib/objects.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { startControlPlane, userKubeConfig, type ControlPlane } from '../../scripts/controlplane/controlplane.ts';
import { applyCRDs, loadCRDs } from '../../scripts/controlplane/crds.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { registerWebhook } from '../../scripts/system/webhook.ts';
import { prepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { eventually } from '../../scripts/lib/wait.ts';
import { pingEvent, postEvents, UNSIGNED_EVENTS } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { consumerEvent, identityEvent } from '../helpers/mirror-sync.ts';
import { postPrepare, prepareTarget } from '../helpers/prepare.ts';

const dir = join(REPO_ROOT, '.local', `never-source-${process.pid}`);
const SECRET = sentinel();
const logs = [captureLogger('mirror-sync'), captureLogger('identity-status'), captureLogger('admission')];
let cp: ControlPlane;
let a: Clients;
/** This control plane's identities and TerraformClusters, as admin. */
let ids: CustomObjects<TerraformClusterIdentity>;
let clusters: CustomObjects<Consumer>;
let mirrorSync: FunctionHandle;
let identityStatus: FunctionHandle;
let admission: FunctionHandle;
let tenant: Clients;
const fns: FunctionHandle[] = [];

/** The shipped CRDs, with the identity CRD's rule on `spec.secretRef.name` taken out (as before it existed). */
function crdsWithoutRule(): V1CustomResourceDefinition[] {
  return loadCRDs().map((crd) => {
    if (crd.spec.names.kind !== IDENTITY_RESOURCE.kind) return crd;
    const copy = structuredClone(crd);
    const schema = copy.spec.versions[0]!.schema!.openAPIV3Schema!;
    const name = schema.properties!.spec!.properties!.secretRef!.properties!.name!;
    assert.ok(name.x_kubernetes_validations, 'the shipped CRD has the rule this file takes out');
    delete name.x_kubernetes_validations;
    return copy;
  });
}

/** Applies `mods` to identity `name` as it is now and writes it back (read again on a conflict). */
const update = (name: string, ...mods: fx.Modifier<TerraformClusterIdentity>[]) =>
  retryOnConflict(async () => {
    const current = await ids.get({ name });
    for (const m of mods) m(current);
    return ids.replace(current);
  });

/** The mirror of `identityName` in `namespace`, if any. */
const mirrorIn = (namespace: string, identityName: string) =>
  ignoreNotFound(a.core.readNamespacedSecret({ name: mirrorName(identityName), namespace }));

/** Sends events to mirror-sync and waits for its answer (200: the work is done). */
async function toMirrorSync(...events: Parameters<typeof postEvents>[1][]): Promise<void> {
  for (const e of events) {
    const r = await postEvents(`http://127.0.0.1:${mirrorSync.port}/`, e);
    assert.equal(r.status, 200, r.text);
  }
}

/** A mirror as mirror-sync would have written it for `identityName` before the rule: the launderer's copy. */
async function launderedCopy(identityName: string, owner: Consumer): Promise<void> {
  const source = await a.core.readNamespacedSecret({ name: 'creds', namespace: 'ops' });
  const where = owner.metadata.namespace!;
  const body = fx.mirrorOf(
    identityName,
    fx.inNamespace(where),
    fx.labels({ [LABEL_MIRRORED]: 'true', 'captf.io/managed': 'true' }),
    fx.annotations({ [ANNOTATION_IDENTITY]: identityName, [ANNOTATION_SOURCE_HASH]: sourceHash(source.data) }),
    fx.ownedBy(owner),
  );
  await a.core.createNamespacedSecret({ namespace: where, body: { ...body, data: source.data } });
}

/** A tenant admin: the user `tenant-admin` may manage identities, and read the Secrets in team-a (so also the mirror there). */
async function tenantAdmin(): Promise<Clients> {
  const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
  const subjects = [{ kind: 'User', name: 'tenant-admin', apiGroup: 'rbac.authorization.k8s.io' }];
  const { group, plural } = IDENTITY_RESOURCE;
  await rbac.createClusterRole({
    body: {
      metadata: { name: 'identity-editor' },
      rules: [{ apiGroups: [group], resources: [plural], verbs: ['get', 'create', 'update', 'patch'] }],
    },
  });
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name: 'tenant-identity-editor' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'identity-editor' },
      subjects,
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
      subjects,
    },
  });
  const kc = new KubeConfig();
  kc.loadFromFile(await userKubeConfig(dir, 'tenant-admin'));
  return makeClients(kc);
}

before(async () => {
  cp = await startControlPlane({ dir, log: () => undefined });
  const kc = new KubeConfig();
  kc.loadFromFile(cp.kubeconfigPath);
  a = makeClients(kc);
  ids = identities(a);
  clusters = consumerObjects(a, TERRAFORM_CLUSTER);
  await applyCRDs(kc, crdsWithoutRule());
  for (const n of ['ops', 'team-a', 'team-b', 'team-c']) await a.core.createNamespace({ body: fx.namespace(n) });
  await a.core.createNamespacedSecret({
    namespace: 'ops',
    body: fx.sourceSecret('creds', fx.inNamespace('ops'), fx.data({ token: SECRET })),
  });
  const opts = (i: number) => ({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: kc,
    logger: logs[i]!.logger,
    env: UNSIGNED_EVENTS,
  });
  mirrorSync = await startMirrorSync(opts(0));
  identityStatus = await startIdentityStatus(opts(1));
  const { leaf, caPem } = await createWebhookPair(dir, 'captf-never-source-ca');
  admission = await startAdmission({
    ...opts(2),
    env: { CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
  });
  fns.push(mirrorSync, identityStatus, admission);
  await registerWebhook(kc, { url: `https://127.0.0.1:${admission.port}`, caBundlePem: caPem });
  tenant = await tenantAdmin();
  await a.core.createNamespacedSecret({
    namespace: 'team-a',
    body: fx.sourceSecret('tenant-own', fx.inNamespace('team-a'), fx.data({ token: 'tenant' })),
  });
});

after(async () => {
  for (const f of fns) await f.close().catch(() => undefined);
  await cp?.stop();
  rmSync(dir, { recursive: true, force: true });
  assertNoSecret(logs.flatMap((l) => l.lines).join('\n'), [SECRET], 'function logs');
});

describe('a mirror is never a source (SPEC §3)', () => {
  const operatorSource = fx.secretRef('ops', 'creds');
  /** The result of `p`: undefined when it succeeds, else the API error's code and body. */
  const refusal = async (p: Promise<unknown>) => {
    const err = await p.then(
      () => undefined,
      (e: unknown) => e,
    );
    return err === undefined ? undefined : { code: apiStatus(err), body: String((err as { body?: unknown }).body) };
  };

  it('the operator identity mirrors into team-a', async () => {
    await ids.create(fx.identity('aws-prod', operatorSource, fx.allowList('team-a', 'team-c')));
    const c = await clusters.create(fx.consumer('prod', fx.inNamespace('team-a'), fx.identityRef('aws-prod')));
    await toMirrorSync(consumerEvent(c));
    const m = await mirrorIn('team-a', 'aws-prod');
    assert.ok(m && isOurs(m, 'aws-prod', { namespace: 'ops', name: 'creds' }));
  });

  it('the webhook refuses a tenant laundering the mirror by create and by update, naming whose mirror it is', async () => {
    // The tenant may read team-a's Secrets, mirror included: a SubjectAccessReview alone would pass.
    await tenant.core.readNamespacedSecret({ name: mirrorName('aws-prod'), namespace: 'team-a' });
    const asTenant = identities(tenant);
    /** An identity of the tenant's, on Secret `secret` of team-a, allowing every namespace. */
    const tenantIdentity = (name: string, secret: string) =>
      fx.identity(name, fx.secretRef('team-a', secret), fx.allowSelector());
    // The API server picks the webhook configuration up within moments: until then a create gets through.
    const created = await eventually('the webhook to refuse the launderer', async () => {
      const r = await refusal(asTenant.create(tenantIdentity('aws-copy-new', mirrorName('aws-prod'))));
      if (!r) await ids.delete({ name: 'aws-copy-new' });
      return r;
    });
    assert.equal(created.code, 422);
    assert.match(created.body, /denied the request.*reserved for the mirrors.*aws-prod/);
    // Its own identity on its own Secret is fine; moving it onto the mirror is not.
    await asTenant.create(tenantIdentity('tenant-id', 'tenant-own'));
    const current = await ids.get({ name: 'tenant-id' });
    const updated = await refusal(
      asTenant.replace({ ...tenantIdentity('tenant-id', mirrorName('aws-prod')), metadata: current.metadata }),
    );
    assert.equal(updated?.code, 422);
    assert.match(updated!.body, /reserved for the mirrors.*aws-prod/);
  });

  it('identities stored before the rule (around the webhook) are inert; the shipped CRD then refuses new ones', async () => {
    await a.kc
      .makeApiClient(AdmissionregistrationV1Api)
      .deleteValidatingWebhookConfiguration({ name: 'captf-credentials-local' });
    // The launderer, with a copy it got before the rule, used in team-c; and a squatter on a
    // mirror name nobody uses yet. The API server drops the configuration within moments: until
    // then the webhook still refuses.
    await eventually('the API server to stop calling the webhook', async () => {
      const r = await refusal(
        ids.create(fx.identity('aws-copy', fx.secretRef('team-a', mirrorName('aws-prod')), fx.allowSelector())),
      );
      if (r && !/denied the request/.test(r.body)) throw new Error(`creating aws-copy: ${r.code} ${r.body}`);
      return r === undefined;
    });
    await ids.create(fx.identity('squat', fx.secretRef('team-b', mirrorName('aws-dev')), fx.allowList('team-b')));
    const victim = await clusters.create(fx.consumer('tenant', fx.inNamespace('team-c'), fx.identityRef('aws-copy')));
    await launderedCopy('aws-copy', victim);
    await applyCRDs(a.kc, loadCRDs());

    await toMirrorSync(pingEvent(), identityEvent(fx.identity('aws-copy')), consumerEvent(victim));
    assert.equal(await mirrorIn('team-c', 'aws-copy'), undefined, 'the laundered copy is deleted');
    const got = await clusters.get({ name: 'tenant', namespace: 'team-c' });
    assert.equal(fx.conditionOf(got, 'CredentialsMirrored')?.reason, 'SourceIsMirror');
    assert.equal(fx.conditionOf(got, 'IdentityAllowed')?.status, 'True');
    assert.match(fx.conditionOf(got, 'CredentialsMirrored')!.message, /aws-copy is inert/);
    // The provider's manager is told why no Job may start there.
    const manager = await prepareCaller(a.kc, { namespace: 'ops', name: 'captf-controller-manager', suffix: 'm' });
    const prep = await postPrepare(`http://127.0.0.1:${mirrorSync.port}`, prepareTarget(victim), manager);
    assert.equal(prep.status, 409, prep.text);
    assert.equal(prep.body.reason, 'SourceIsMirror');
    assert.equal(prep.body.sourceHash, undefined);
    // The operator's consumer is untouched: the launderer does not make its mirror "not ours".
    const prod = await clusters.get({ name: 'prod', namespace: 'team-a' });
    assert.equal(fx.conditionOf(prod, 'CredentialsMirrored')?.reason, 'Mirrored');
    const m = (await mirrorIn('team-a', 'aws-prod'))!;
    assert.ok(isCurrent(m, sourceHash((await a.core.readNamespacedSecret({ name: 'creds', namespace: 'ops' })).data)));

    assert.equal((await postEvents(`http://127.0.0.1:${identityStatus.port}/`, pingEvent('status'))).status, 200);
    for (const [name, reason] of [
      ['aws-copy', 'SecretIsMirror'],
      ['squat', 'SecretIsMirror'],
      ['aws-prod', 'SecretFound'],
    ] as const) {
      assert.equal(fx.conditionOf(await ids.get({ name }), 'Ready')?.reason, reason, name);
    }
  });

  it('the squatter takes no mirror name first: a later identity gets its mirror, and keeps it across a resync', async () => {
    await ids.create(fx.identity('aws-dev', operatorSource, fx.allowList('team-b')));
    const c = await clusters.create(fx.consumer('dev', fx.inNamespace('team-b'), fx.identityRef('aws-dev')));
    await toMirrorSync(consumerEvent(c), identityEvent(fx.identity('squat')), pingEvent());
    const m = await mirrorIn('team-b', 'aws-dev');
    assert.ok(m && isOurs(m, 'aws-dev', { namespace: 'ops', name: 'creds' }));
    assert.equal(
      fx.conditionOf(await clusters.get({ name: 'dev', namespace: 'team-b' }), 'CredentialsMirrored')?.reason,
      'Mirrored',
    );
  });

  it('the operator still revokes: narrowing deletes the mirror another identity names', async () => {
    await update('aws-prod', fx.allowList('team-c'));
    await toMirrorSync(identityEvent(fx.identity('aws-prod')));
    assert.equal(await mirrorIn('team-a', 'aws-prod'), undefined);
    const prod = await clusters.get({ name: 'prod', namespace: 'team-a' });
    assert.equal(fx.conditionOf(prod, 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
  });

  it('the CRD rule ratchets: an inert identity may be narrowed and lose its finalizers, never moved onto a mirror', async () => {
    await update('aws-copy', fx.finalizers('captf.io/test'));
    await update('aws-copy', fx.allowList());
    await update('aws-copy', fx.finalizers(), fx.labels({ narrowed: 'true' }));
    const moved = await refusal(update('aws-copy', fx.secretRef('team-a', mirrorName('aws-dev'))));
    assert.equal(moved?.code, 422, 'moving onto another mirror is refused by CEL alone');
    assert.match(moved!.body, /reserved for mirrors.*aws-dev/);
    const created = await refusal(ids.create(fx.identity('late-copy', fx.secretRef('team-c', mirrorName('aws-prod')))));
    assert.equal(created?.code, 422, 'the CRD refuses a new one with no webhook at all');
    await eventually('nothing left of the launderer', async () => (await mirrorIn('team-c', 'aws-copy')) === undefined);
  });
});
