/**
 * Edge cases, through the real API server: an input
 * the reconcile cannot act on ends in a visible outcome that is not retried (a cluster-scoped
 * consumer kind, an event without a namespace); a Secret that an identity names as its
 * source is never written or deleted, whatever its labels; a write refused for good says who
 * lacked what, or that the namespace is being deleted, and is not retried.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ApiextensionsV1Api, KubeConfig } from '@kubernetes/client-node';
import { API_VERSION, GROUP, VERSION, type Consumer } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import { admin, asUser, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { apiServerEvent, pingEvent } from '../helpers/events.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { manager, postPrepare } from '../helpers/prepare.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import {
  conditionOf,
  consumerEvent,
  createConsumer,
  deleteIdentity,
  deliver,
  getConsumer,
  getMirror,
  putIdentity,
  refuseSecrets,
} from '../helpers/mirror-sync.ts';

const a = admin();
const ns = namespaces('edge');
const log = captureLogger('mirror-sync');
const SECRET = sentinel();
const source = { name: 'creds', namespace: '' };
// A cluster-scoped consumer kind of this file's own, so no other file sees it.
const G = `edge-${suffix()}.captf.test`;
const PLURAL = 'terraformglobals';
const KINDS = `${GROUP}/${VERSION}/TerraformCluster/terraformclusters,${G}/v1/TerraformGlobal/${PLURAL}`;
let fn: FunctionHandle;
let url: string;
/** The manager, allowed to prepare the shipped kinds and this file's cluster-scoped one. */
let caller: PrepareCaller;

before(async () => {
  source.namespace = await ns.create();
  await a.core.createNamespacedSecret({
    namespace: source.namespace,
    body: { metadata: { name: source.name }, stringData: { token: SECRET } },
  });
  await installClusterScopedKind();
  fn = await start({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: a.kc,
    logger: log.logger,
    env: { CAPTF_CONSUMER_KINDS: KINDS },
  });
  url = `http://127.0.0.1:${fn.port}/`;
  caller = await manager(ns, {
    extraRules: [{ apiGroups: [G], resources: [`${PLURAL}/prepare`], verbs: ['create'] }],
  });
});
after(async () => {
  await fn?.close();
  assertNoSecret(log.lines.join('\n'), [SECRET, ...(caller ? [caller.token] : [])], 'mirror-sync log');
});

/** A cluster-scoped CRD with `spec.identityRef` and a status subresource. */
async function installClusterScopedKind(): Promise<void> {
  const ext = a.kc.makeApiClient(ApiextensionsV1Api);
  const name = `${PLURAL}.${G}`;
  await ext.createCustomResourceDefinition({
    body: {
      metadata: { name },
      spec: {
        group: G,
        scope: 'Cluster',
        names: {
          kind: 'TerraformGlobal',
          plural: PLURAL,
          singular: 'terraformglobal',
          listKind: 'TerraformGlobalList',
        },
        versions: [
          {
            name: 'v1',
            served: true,
            storage: true,
            subresources: { status: {} },
            selectableFields: [{ jsonPath: '.spec.identityRef.name' }],
            schema: {
              openAPIV3Schema: {
                type: 'object',
                properties: {
                  spec: {
                    type: 'object',
                    properties: { identityRef: { type: 'object', properties: { name: { type: 'string' } } } },
                  },
                  status: { type: 'object', x_kubernetes_preserve_unknown_fields: true },
                },
              },
            },
          },
        ],
      },
    },
  });
  ns.onCleanup(() => ext.deleteCustomResourceDefinition({ name }).then(() => undefined));
  await eventually('the cluster-scoped CRD to be served', async () => {
    try {
      await a.custom.listClusterCustomObject({ group: G, version: 'v1', plural: PLURAL });
      return true;
    } catch {
      return false;
    }
  });
}

async function newIdentity(allowed: Parameters<typeof putIdentity>[3], ref = source): Promise<string> {
  const name = `id-${suffix()}`;
  ns.onCleanup(() => deleteIdentity(a, name));
  await putIdentity(a, name, ref, allowed);
  return name;
}

const globalEvent = (name: string) =>
  apiServerEvent(
    { apiVersion: `${G}/v1`, kind: 'TerraformGlobal', metadata: { name } as never },
    'ref',
    'update',
    PLURAL,
  );

const prepare = async (body: unknown) => {
  const r = await postPrepare(url, body, caller);
  return { status: r.status, body: r.body as { reason?: string; error?: string } };
};

const linesAbout = (object: string) => log.entries().filter((e) => e.object === object);

describe('an input the reconcile cannot act on ends in a visible outcome, once', () => {
  it('a cluster-scoped consumer is NamespaceNotAllowed, prepare refuses it, and resyncs leave it alone', async () => {
    const id = await newIdentity({ selector: {} });
    const name = `global-${suffix()}`;
    await a.custom.createClusterCustomObject({
      group: G,
      version: 'v1',
      plural: PLURAL,
      body: { apiVersion: `${G}/v1`, kind: 'TerraformGlobal', metadata: { name }, spec: { identityRef: { name: id } } },
    });
    ns.onCleanup(() => a.custom.deleteClusterCustomObject({ group: G, version: 'v1', plural: PLURAL, name }));
    const r = await deliver(url, globalEvent(name), { retries: 0 });
    assert.equal(r.status, 200, r.text);
    const result = (r.body as { events: { results: { reason: string; retry: boolean }[] }[] }).events[0]!.results;
    assert.deepEqual(result, [
      { object: `/${name}`, outcome: 'not-allowed', reason: 'NamespaceNotAllowed', retry: false },
    ]);
    const get = async () =>
      (await a.custom.getClusterCustomObject({ group: G, version: 'v1', plural: PLURAL, name })) as Consumer;
    const obj = await get();
    const cond = conditionOf(obj, 'IdentityAllowed');
    assert.equal(cond?.status, 'False');
    assert.equal(cond?.reason, 'NamespaceNotAllowed');
    assert.match(cond!.message, /cluster-scoped objects cannot use credentials/);
    assert.equal(linesAbout(`/${name}`).length, 1, 'one log line');

    const p = await prepare({ apiVersion: `${G}/v1`, kind: 'TerraformGlobal', namespace: '', name });
    assert.equal(p.status, 403, JSON.stringify(p.body));
    assert.equal(p.body.reason, 'IdentityNotAllowed');

    // Two resyncs: nothing is written to it again and nothing fails about it (no retry loop).
    for (let i = 0; i < 2; i++) assert.equal((await deliver(url, pingEvent(), { retries: 0 })).status, 200);
    assert.equal((await get()).metadata.resourceVersion, obj.metadata.resourceVersion, 'no write');
    const errors = log.entries().filter((e) => e.level !== 'info' && JSON.stringify(e).includes(name));
    assert.deepEqual(errors, []);
  });

  it('a consumer event without a namespace for a namespaced kind is answered with a result saying so', async () => {
    const r = await deliver(
      url,
      apiServerEvent(
        { apiVersion: API_VERSION, kind: 'TerraformCluster', metadata: { name: 'x' } as never },
        'ref',
        'update',
        'terraformclusters',
      ),
      { retries: 0 },
    );
    assert.equal(r.status, 200, r.text);
    const results = (r.body as { events: { results: { reason: string; retry: boolean }[] }[] }).events[0]!.results;
    assert.equal(results.length, 1);
    assert.equal(results[0]!.reason, 'ObjectGone');
    assert.equal(results[0]!.retry, false);
  });
});

describe('a write refused for good says why and is not retried', () => {
  it('a 403 from a policy names the user, verb, resource and namespace, never the data', async () => {
    const label = `captf-test-forbid-${suffix()}`;
    const n = await ns.create({ [label]: 'true' });
    const id = await newIdentity({ list: [n] });
    const user = `forbidden-${suffix()}`;
    const u = await asUser(user, ['system:masters']);
    const kc = new KubeConfig();
    kc.loadFromFile(u.kubeconfigPath);
    const other = await start({ port: 0, host: '127.0.0.1', kubeconfig: kc, logger: log.logger, env: {} });
    ns.onCleanup(() => other.close());
    // Forbidden (403), with a message that echoes the data back: it must not reach the condition.
    ns.onCleanup(
      await refuseSecrets(a, {
        label,
        operations: ['CREATE', 'UPDATE'],
        messageExpression: "'no: ' + string(object.data)",
        reason: 'Forbidden',
      }),
    );
    const c = await createConsumer(a, n, 'refused', id);
    const cond = await eventually(
      'the policy to refuse the mirror write',
      async () => {
        await a.core.deleteNamespacedSecret({ name: mirrorName(id), namespace: n }).catch(() => undefined);
        const r = await deliver(`http://127.0.0.1:${other.port}/`, consumerEvent(c), { retries: 0 });
        const got = conditionOf(await getConsumer(a, n, 'refused'), 'CredentialsMirrored');
        return r.status === 200 && got?.reason === 'MirrorFailed' && /403/.test(got.message) ? got : undefined;
      },
      60_000,
    );
    // The user is whoever wrote the condition last: this instance, or another file's resync
    // (cluster-wide, same control plane); either way a real name from a SelfSubjectReview.
    // Not the RBAC authorizer's sentence, so the policy's message is withheld (SPEC §15).
    assert.match(
      cond.message,
      new RegExp(
        `HTTP 403 Forbidden \\(create secrets "${mirrorName(id)}" in namespace "${n}" as "(${user}|admin|[\\w:.-]+)"\\): ` +
          'refused \\(by a policy or webhook\\); its message is withheld',
      ),
    );
    assert.match(cond.message, new RegExp(`create mirror Secret ${n}/${mirrorName(id)}`));
    assertNoSecret(JSON.stringify(cond), [SECRET, Buffer.from(SECRET).toString('base64')], 'condition');
  });

  it('a namespace being deleted says so in the condition, and the event is not retried', async () => {
    const n = await ns.create();
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'late', id);
    // A finalizer keeps the namespace Terminating while the test runs.
    await a.core.createNamespacedConfigMap({
      namespace: n,
      body: { metadata: { name: 'hold', finalizers: ['captf.io/test-hold'] } },
    });
    ns.onCleanup(() =>
      a.core
        .patchNamespacedConfigMap({
          name: 'hold',
          namespace: n,
          body: [{ op: 'remove', path: '/metadata/finalizers' }],
        })
        .then(
          () => undefined,
          () => undefined,
        ),
    );
    await a.core.deleteNamespace({ name: n });
    await eventually('the namespace to be Terminating', async () => {
      const got = await a.core.readNamespace({ name: n });
      return got.status?.phase === 'Terminating';
    });
    const r = await deliver(url, consumerEvent(c), { retries: 0 });
    const cond = conditionOf(await getConsumer(a, n, 'late'), 'CredentialsMirrored');
    if (cond?.reason === 'Mirrored') return; // another file's resync mirrored it before the deletion
    assert.equal(r.status, 200, r.text);
    assert.equal(cond?.reason, 'MirrorFailed');
    assert.match(cond!.message, new RegExp(`namespace ${n} is being deleted \\(NamespaceTerminating\\)`));
  });
});

describe('a revocation the API server refuses says so', () => {
  it('a refused delete leaves MirrorFailed saying the credentials are still there, never the data', async () => {
    const label = `captf-test-nodelete-${suffix()}`;
    const n = await ns.create({ [label]: 'true' });
    const id = await newIdentity({ list: [n] });
    const c = await createConsumer(a, n, 'kept', id);
    assert.equal((await deliver(url, consumerEvent(c), { retries: 0 })).status, 200);
    assert.ok(await getMirror(a, n, id));
    // A careless policy that echoes the data of the Secret being deleted.
    ns.onCleanup(
      await refuseSecrets(a, {
        label,
        operations: ['DELETE'],
        messageExpression: "'keep: ' + string(oldObject.data)",
      }),
    );
    // The policy takes a moment to be enforced: wait until it refuses deleting a probe Secret.
    await a.core.createNamespacedSecret({ namespace: n, body: { metadata: { name: 'probe' } } });
    await eventually(
      'the policy to refuse deletes',
      async () => {
        try {
          await a.core.deleteNamespacedSecret({ namespace: n, name: 'probe', dryRun: 'All' });
          return false;
        } catch {
          return true;
        }
      },
      60_000,
    );
    await putIdentity(a, id, source, { list: [] });
    let last = '';
    const cond = await eventually(
      'the refused revocation to show',
      async () => {
        const r = await deliver(url, consumerEvent(c), { retries: 0 });
        const got = conditionOf(await getConsumer(a, n, 'kept'), 'CredentialsMirrored');
        last = `${r.status} ${r.text} ${JSON.stringify(got)}`;
        return r.status === 200 && got?.reason === 'MirrorFailed' ? got : undefined;
      },
      60_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last answer: ${last}; log: ${log.lines.slice(-5).join('\n')}`);
    });
    assert.match(cond.message, /could not be deleted and still holds the credentials/);
    assert.equal(conditionOf(await getConsumer(a, n, 'kept'), 'IdentityAllowed')?.reason, 'NamespaceNotAllowed');
    assert.ok(await getMirror(a, n, id), 'the policy kept it');
    assertNoSecret(JSON.stringify(cond), [SECRET], 'condition');
    assert.ok(
      log.entries().some((e) => e.level === 'warn' && e.message === 'reconcile key' && e.identity === id),
      'logged as a warning',
    );
  });
});
