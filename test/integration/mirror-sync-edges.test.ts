/**
 * Edge cases, through the real API server: an input
 * the reconcile cannot act on ends in a visible outcome that is not retried (a cluster-scoped
 * consumer kind, never listed in a namespace; an event placing a consumer where its kind's
 * scope rules out answers 400); a Secret that an identity names as its
 * source is never written or deleted, whatever its labels; a write refused for good says who
 * lacked what, and is not retried.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ApiextensionsV1Api } from '@kubernetes/client-node';
import { TERRAFORM_CLUSTER, type ConsumerKind } from '../../functions/lib/api.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { consumerObjects } from '../../functions/lib/objects.ts';
import { asUser, eventually, suffix } from '../helpers/cluster.ts';
import { apiServerEvent, pingEvent } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, sentinel } from '../helpers/logs.ts';
import {
  consumerEvent,
  identityEvent,
  keyEvent,
  consumerKindsSetting,
  deliver,
  mirrorSyncUnderTest,
  operatorSource,
  outcomes,
  prepareManager,
  readCondition,
  refuseSecrets,
  type MirrorSyncUnderTest,
  type OperatorSource,
  type PrepareManager,
} from '../helpers/mirror-sync.ts';
import { prepareTarget } from '../helpers/prepare.ts';

/** A cluster-scoped consumer kind of this file's own, so no other file sees it. */
const GLOBAL: ConsumerKind = {
  group: `edge-${suffix()}.captf.test`,
  version: 'v1',
  kind: 'TerraformGlobal',
  plural: 'terraformglobals',
};
const KINDS = [TERRAFORM_CLUSTER, GLOBAL];
const w = fx.world('edge', { kinds: [GLOBAL] });
const a = w.clients;
const SECRET = sentinel();
let ms: MirrorSyncUnderTest;
let source: OperatorSource;
/** The manager, allowed to prepare the shipped kinds and this file's cluster-scoped one. */
let manager: PrepareManager;

before(async () => {
  source = await operatorSource(w, fx.data({ token: SECRET }));
  await installClusterScopedKind();
  ms = await mirrorSyncUnderTest(w, { env: { CAPTF_CONSUMER_KINDS: consumerKindsSetting(...KINDS) } });
  manager = await prepareManager(w, ms, {
    extraRules: [{ apiGroups: [GLOBAL.group], resources: [`${GLOBAL.plural}/prepare`], verbs: ['create'] }],
  });
});
after(() => {
  assertNoSecret(
    ms?.log.lines.join('\n') ?? '',
    [SECRET, ...(manager ? [manager.caller.token] : [])],
    'mirror-sync log',
  );
});

/** A cluster-scoped CRD with `spec.identityRef` and a status subresource. */
async function installClusterScopedKind(): Promise<void> {
  const ext = a.kc.makeApiClient(ApiextensionsV1Api);
  const { group, version, kind, plural } = GLOBAL;
  const name = `${plural}.${group}`;
  await ext.createCustomResourceDefinition({
    body: {
      metadata: { name },
      spec: {
        group,
        scope: 'Cluster',
        names: { kind, plural, singular: kind.toLowerCase(), listKind: `${kind}List` },
        versions: [
          {
            name: version,
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
  w.onCleanup(() => ext.deleteCustomResourceDefinition({ name }).then(() => undefined));
  await eventually('the cluster-scoped CRD to be served', async () => {
    try {
      await consumerObjects(a, GLOBAL).list();
      return true;
    } catch {
      return false;
    }
  });
}

const linesAbout = (object: string) => ms.log.entries().filter((e) => e.object === object);

describe('an input the reconcile cannot act on ends in a visible outcome, once', () => {
  it('a cluster-scoped consumer is NamespaceNotAllowed, prepare refuses it, and resyncs leave it alone', async () => {
    const id = await source.newIdentity(fx.allowSelector());
    const name = w.name('global');
    const global = await w.create(fx.consumer(name, fx.ofKind(GLOBAL), fx.identityRef(id)));
    const r = await deliver(ms, consumerEvent(global, 'ref', 'update', KINDS), { retries: 0 });
    assert.equal(r.status, 200, r.text);
    const result = (r.body as { events: { results: { reason: string; retry: boolean }[] }[] }).events[0]!.results;
    assert.deepEqual(result, [
      { object: `/${name}`, outcome: 'not-allowed', reason: 'NamespaceNotAllowed', retry: false },
    ]);
    const obj = (await w.read(global))!;
    const cond = fx.conditionOf(obj, 'IdentityAllowed');
    assert.equal(cond?.status, 'False');
    assert.equal(cond?.reason, 'NamespaceNotAllowed');
    assert.match(cond!.message, /cluster-scoped objects cannot use credentials/);
    assert.equal(linesAbout(`/${name}`).length, 1, 'one log line');

    const p = await manager.prepare({ ...prepareTarget(global), namespace: '' });
    assert.equal(p.status, 403, JSON.stringify(p.body));
    assert.equal(p.body.reason, 'IdentityNotAllowed');

    // Two resyncs: nothing is written to it again and nothing fails about it (no retry loop).
    for (let i = 0; i < 2; i++) assert.equal((await deliver(ms, pingEvent(), { retries: 0 })).status, 200);
    assert.equal((await w.read(global))!.metadata.resourceVersion, obj.metadata.resourceVersion, 'no write');
    const errors = ms.log
      .entries()
      .filter((e) => (e.level === 'warn' || e.level === 'error') && JSON.stringify(e).includes(name));
    assert.deepEqual(errors, []);
  });

  it("an event placing a consumer where its kind's scope rules out answers 400 and is logged (SPEC §4)", async () => {
    const n = await w.namespace();
    const cases = [
      { ev: consumerEvent(fx.consumer(w.name('x')), 'ref', 'update', KINDS), want: /TerraformCluster is namespaced/ },
      {
        ev: consumerEvent(fx.consumer(w.name('g'), fx.inNamespace(n), fx.ofKind(GLOBAL)), 'ref', 'update', KINDS),
        want: new RegExp(`TerraformGlobal is cluster-scoped, but namespace ${n} was given`),
      },
    ];
    for (const { ev, want } of cases) {
      const r = await deliver(ms, ev, { retries: 0 });
      assert.equal(r.status, 400, r.text);
      assert.match(r.text, want);
      assert.ok(
        ms.log.entries().some((e) => e.message === 'bad event' && want.test(JSON.stringify(e))),
        'logged as a bad event',
      );
    }
    const p = await manager.prepare({ ...prepareTarget(fx.consumer('x', fx.inNamespace(n))), namespace: '' });
    assert.equal(p.status, 400, JSON.stringify(p.body));
    assert.match(String(p.body.error), /TerraformCluster is namespaced, but no namespace was given/);
  });

  it('a Namespace event never lists a cluster-scoped kind in the namespace', async () => {
    const n = await w.namespace();
    const id = await source.newIdentity(fx.allowList(n));
    await w.create(fx.consumer('in-ns', fx.inNamespace(n), fx.identityRef(id)));
    const r = await deliver(ms, apiServerEvent(fx.namespace(n), 'ref', 'update', 'namespaces'), { retries: 0 });
    assert.equal(r.status, 200, r.text);
    // A pass reports the keys it changed: none when another file's resync mirrored it first.
    assert.ok([0, 1].includes(outcomes(r.body).length), r.text);
    for (const o of outcomes(r.body)) assert.deepEqual(o, [`${n}/in-ns`, 'mirrored']);
    assert.equal(
      (await readCondition(w, fx.consumer('in-ns', fx.inNamespace(n)), 'CredentialsMirrored'))?.reason,
      'Mirrored',
    );
    const lines = ms.log
      .entries()
      .filter((e) => (e.level === 'warn' || e.level === 'error') && JSON.stringify(e).includes(n));
    assert.deepEqual(lines, [], 'no failed list, no warning');
  });
});

describe('a write refused for good says why and is not retried', () => {
  it('a 403 from a policy names the user, verb, resource and namespace, never the data', async () => {
    const label = w.name('forbid');
    const n = await w.namespace(fx.labels({ [label]: 'true' }));
    const id = await source.newIdentity(fx.allowList(n));
    const user = `forbidden-${suffix()}`;
    const u = await asUser(user, ['system:masters']);
    const other = await mirrorSyncUnderTest(w, { kubeconfig: u.kc, log: ms.log });
    // Forbidden (403), with a message that echoes the data back: it must not reach the condition.
    w.onCleanup(
      await refuseSecrets(a, {
        label,
        operations: ['CREATE', 'UPDATE'],
        messageExpression: "'no: ' + string(object.data)",
        reason: 'Forbidden',
      }),
    );
    const c = await w.create(fx.consumer('refused', fx.inNamespace(n), fx.identityRef(id)));
    const cond = await eventually(
      'the policy to refuse the mirror write',
      async () => {
        await w.delete(fx.mirrorOf(id, fx.inNamespace(n)));
        // The key's reconcile: once the consumer is decided, its own event is only an echo.
        const r = await deliver(other, keyEvent(n, id), { retries: 0 });
        const got = await readCondition(w, c, 'CredentialsMirrored');
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
});

describe('a revocation the API server refuses says so', () => {
  it('a refused delete leaves MirrorFailed saying the credentials are still there, never the data', async () => {
    const label = w.name('nodelete');
    const n = await w.namespace(fx.labels({ [label]: 'true' }));
    const id = await source.newIdentity(fx.allowList(n));
    const c = await w.create(fx.consumer('kept', fx.inNamespace(n), fx.identityRef(id)));
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    assert.equal((await deliver(ms, consumerEvent(c), { retries: 0 })).status, 200);
    assert.ok(await w.read(mirror));
    // A careless policy that echoes the data of the Secret being deleted.
    w.onCleanup(
      await refuseSecrets(a, {
        label,
        operations: ['DELETE'],
        messageExpression: "'keep: ' + string(oldObject.data)",
      }),
    );
    // The policy takes a moment to be enforced: wait until it refuses deleting a probe Secret.
    await w.create(fx.sourceSecret('probe', fx.inNamespace(n)));
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
    const narrowed = await w.put(fx.identity(id, source.ref, fx.allowList()));
    let last = '';
    const cond = await eventually(
      'the refused revocation to show',
      async () => {
        const r = await deliver(ms, identityEvent(narrowed), { retries: 0 });
        const got = await readCondition(w, c, 'CredentialsMirrored');
        last = `${r.status} ${r.text} ${JSON.stringify(got)}`;
        return r.status === 200 && got?.reason === 'MirrorFailed' ? got : undefined;
      },
      60_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last answer: ${last}; log: ${ms.log.lines.slice(-5).join('\n')}`);
    });
    assert.match(cond.message, /could not be deleted; mirror Secret .* is still there and still holds the credentials/);
    assert.match(cond.message, /delete it by hand, or lift what refuses the delete$/);
    const allowed = await readCondition(w, c, 'IdentityAllowed');
    assert.equal(allowed?.reason, 'NamespaceNotAllowed');
    assert.doesNotMatch(allowed!.message, /no mirror is kept there/, 'it does not claim the mirror is gone');
    assert.match(allowed!.message, /is still there .*: deleting it was refused/);
    assert.ok(await w.read(mirror), 'the policy kept it');
    assertNoSecret(JSON.stringify(cond), [SECRET], 'condition');
    assert.ok(
      ms.log.entries().some((e) => e.level === 'warn' && e.message === 'reconcile key' && e.identity === id),
      'logged as a warning',
    );
  });
});
