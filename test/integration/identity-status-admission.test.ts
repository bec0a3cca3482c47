/**
 * identity-status and admission together (SPEC §9, §10): deleting an identity is refused
 * while it is in use, and allowed once its last consumer and mirror are gone and a status
 * refresh has emptied `status.namespaces`. Both functions run in-process as their
 * ServiceAccounts; the API server calls the webhook over HTTPS (test CA). The webhook and the
 * refreshes only see identities labeled with this file's label, so other test files are
 * unaffected.
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { start as startStatus } from '../../functions/identity-status/index.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { desiredMirror } from '../../functions/lib/mirror.ts';
import { identities } from '../../functions/lib/objects.ts';
import { admissionWebhook, storedIdentity, type Webhook } from '../helpers/admission.ts';
import { eventually } from '../helpers/cluster.ts';
import { pingEvent, postEvents, UNSIGNED_EVENTS } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { scanLater } from '../helpers/leaks.ts';

const w = fx.world('idst-adm');
const a = w.clients;
const statusLog = captureLogger('identity-status');
const secretValue = sentinel();
const responses: string[] = [];
scanLater('HTTP answers', () => responses.join('\n'));
let statusFn: FunctionHandle;
let hook: Webhook;
let src: string;

const refreshAll = async () => {
  const r = await postEvents(`http://127.0.0.1:${statusFn.port}/`, pingEvent('identity-status'));
  responses.push(r.text);
  assert.equal(r.status, 200, r.text);
};
/** The delete's refusal message, or undefined when the delete went through. */
async function tryDelete(name: string): Promise<string | undefined> {
  try {
    await identities(a).delete({ name });
    return undefined;
  } catch (e) {
    assert.equal(apiStatus(e), 403, String((e as { body?: unknown }).body));
    return String((e as { body?: unknown }).body);
  }
}

describe('identity-status with admission: deleting an identity in use', () => {
  before(async () => {
    src = await w.namespace();
    await w.create(fx.sourceSecret('creds', fx.inNamespace(src), fx.data({ token: secretValue })));
    // Admission's own RBAC matrix is admission.test.ts's job.
    hook = await admissionWebhook(w, 'captf-test/identity-status-admission');
    const status = await w.account('captf-identity-status');
    statusFn = await startStatus({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: status.clients.kc,
      logger: statusLog.logger,
      env: { ...UNSIGNED_EVENTS, CAPTF_STATUS_IDENTITY_SELECTOR: hook.selector },
    });
    w.onCleanup(() => statusFn.close());
  });

  it('is refused while used, and allowed after the last consumer and mirror are gone and a refresh emptied status.namespaces', async () => {
    const name = w.name('id');
    await w.create(fx.identity(name, hook.ours, fx.secretRef(src, 'creds'), fx.allowSelector()));
    const [withConsumer, withMirror] = [await w.namespace(), await w.namespace()];
    const user = await w.create(fx.consumer('user', fx.inNamespace(withConsumer), fx.identityRef(name)));
    // A mirror whose users are gone but which is still there (owned by a ConfigMap that stays).
    const cm = await a.core.createNamespacedConfigMap({
      namespace: withMirror,
      body: { metadata: { name: 'holder' } },
    });
    const source = await w.read(fx.sourceSecret('creds', fx.inNamespace(src)));
    await w.create(
      desiredMirror(name, withMirror, source!.data, {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        name: 'holder',
        uid: cm.metadata!.uid!,
      }),
    );

    await refreshAll();
    assert.deepEqual((await storedIdentity(w, name)).status?.namespaces, [withConsumer, withMirror].sort());
    let refusal = await tryDelete(name);
    assert.match(
      refusal ?? 'deleted',
      new RegExp(`in use in 2 namespaces: ${[withConsumer, withMirror].sort().join(', ')} \\(`),
    );

    // Last consumer gone; the refresh still sees the mirror, so the delete is still refused.
    await w.delete(user);
    await refreshAll();
    assert.deepEqual((await storedIdentity(w, name)).status?.namespaces, [withMirror]);
    refusal = await tryDelete(name);
    assert.match(refusal ?? 'deleted', new RegExp(`in use in 1 namespace: ${withMirror} \\(`));

    // Mirror gone, but status.namespaces is only emptied by the next refresh: still refused.
    await w.delete(fx.mirrorOf(name, fx.inNamespace(withMirror)));
    refusal = await tryDelete(name);
    assert.match(refusal ?? 'deleted', /in use/, 'refused until the next refresh');

    await refreshAll();
    assert.deepEqual((await storedIdentity(w, name)).status?.namespaces, []);
    assert.equal(await tryDelete(name), undefined, 'allowed once unused');
    await eventually('the identity to be gone', async () => (await w.read(fx.identity(name))) === undefined);
  });

  it('no planted value in the function logs or answers', () => {
    assertNoSecret(
      [...statusLog.lines, ...hook.log.lines, ...responses].join('\n'),
      [secretValue],
      'function logs and responses',
    );
  });
});
