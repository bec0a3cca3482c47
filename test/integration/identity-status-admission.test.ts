/**
 * identity-status and admission together (SPEC §9, §10): deleting an identity is refused
 * while it is in use, and allowed once its last consumer and mirror are gone and a status
 * refresh has emptied `status.namespaces`. Both functions run in-process; the API server
 * calls the webhook over HTTPS (test CA). The webhook and the refreshes only see identities
 * labeled with this run's label, so other test files are unaffected.
 */
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AdmissionregistrationV1Api, RbacAuthorizationV1Api } from '@kubernetes/client-node';
import { start as startAdmission } from '../../functions/admission/index.ts';
import { start as startStatus } from '../../functions/identity-status/index.ts';
import {
  API_VERSION,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus } from '../../functions/lib/kube.ts';
import { desiredMirror, mirrorName } from '../../functions/lib/mirror.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { webhookConfiguration } from '../../scripts/system/webhook.ts';
import { admin, asUser, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { pingEvent, postEvents } from '../helpers/events.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { scanLater } from '../helpers/leaks.ts';

const a = admin();
const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
const webhooks = a.kc.makeApiClient(AdmissionregistrationV1Api);
const ns = namespaces('idst-adm');
const run = suffix();
const LABEL = 'captf-test/identity-status-admission';
const ids = { group: GROUP, version: VERSION, plural: IDENTITY_PLURAL };
const webhookName = `captf-idst-admission-${run}`;
const statusLog = captureLogger('identity-status');
const admissionLog = captureLogger('admission');
const secretValue = sentinel();
const responses: string[] = [];
scanLater('HTTP answers', () => responses.join('\n'));
let statusFn: FunctionHandle;
let admissionFn: FunctionHandle;
let src: string;

const identityBody = (name: string) => ({
  apiVersion: API_VERSION,
  kind: IDENTITY_KIND,
  metadata: { name, labels: { [LABEL]: run } },
  spec: { secretRef: { name: 'creds', namespace: src }, allowedNamespaces: { selector: {} } },
});
const read = async (name: string) =>
  (await a.custom.getClusterCustomObject({ ...ids, name })) as TerraformClusterIdentity;
const refreshAll = async () => {
  const r = await postEvents(`http://127.0.0.1:${statusFn.port}/`, pingEvent('identity-status'));
  responses.push(r.text);
  assert.equal(r.status, 200, r.text);
};
/** The delete's refusal message, or undefined when the delete went through. */
async function tryDelete(name: string): Promise<string | undefined> {
  try {
    await a.custom.deleteClusterCustomObject({ ...ids, name });
    return undefined;
  } catch (e) {
    assert.equal(apiStatus(e), 403, String((e as { body?: unknown }).body));
    return String((e as { body?: unknown }).body);
  }
}

describe('identity-status with admission: deleting an identity in use', () => {
  before(async () => {
    src = await ns.create();
    await a.core.createNamespacedSecret({
      namespace: src,
      body: { metadata: { name: 'creds' }, stringData: { token: secretValue } },
    });

    // identity-status runs as a user with the RBAC its manifest grants.
    const fnUser = `idst-adm-fn-${run}`;
    await rbac.createClusterRole({
      body: {
        metadata: { name: fnUser },
        rules: [
          { apiGroups: [GROUP], resources: [IDENTITY_PLURAL], verbs: ['get', 'list'] },
          { apiGroups: [GROUP], resources: [`${IDENTITY_PLURAL}/status`], verbs: ['patch'] },
          { apiGroups: [GROUP], resources: ['terraformclusters', 'terraformmachines'], verbs: ['list'] },
          { apiGroups: [''], resources: ['secrets'], verbs: ['get', 'list'] },
        ],
      },
    });
    ns.onCleanup(() => rbac.deleteClusterRole({ name: fnUser }));
    await rbac.createClusterRoleBinding({
      body: {
        metadata: { name: fnUser },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: fnUser },
        subjects: [{ kind: 'User', name: fnUser, apiGroup: 'rbac.authorization.k8s.io' }],
      },
    });
    ns.onCleanup(() => rbac.deleteClusterRoleBinding({ name: fnUser }));
    const statusUser = await asUser(fnUser);
    await eventually(
      'RBAC for the identity-status user',
      async () => (await statusUser.core.readNamespacedSecret({ namespace: src, name: 'creds' })).metadata?.name,
    );
    statusFn = await startStatus({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: statusUser.kc,
      logger: statusLog.logger,
      env: { CAPTF_STATUS_IDENTITY_SELECTOR: `${LABEL}=${run}` },
    });

    // admission over HTTPS with a test CA; its own RBAC matrix is admission.test.ts's job.
    const dir = mkdtempSync(join(tmpdir(), 'captf-idst-adm-'));
    const { leaf, caPem } = await createWebhookPair(dir, `captf-idst-adm-ca-${run}`);
    admissionFn = await startAdmission({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: a.kc,
      logger: admissionLog.logger,
      env: { CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
    });
    await webhooks.createValidatingWebhookConfiguration({
      body: webhookConfiguration({
        url: `https://127.0.0.1:${admissionFn.port}`,
        caBundlePem: caPem,
        name: webhookName,
        matchLabels: { [LABEL]: run },
      }),
    });
    // The webhook is active once it refuses what only it refuses (an unknown selector operator).
    await eventually('the webhook to be active', async () => {
      const name = `probe-${suffix()}`;
      try {
        await a.custom.createClusterCustomObject({
          ...ids,
          body: {
            ...identityBody(name),
            spec: {
              secretRef: { name: 'creds', namespace: src },
              allowedNamespaces: { selector: { matchExpressions: [{ key: 'k', operator: 'Near' }] } },
            },
          },
        });
        await a.custom.deleteClusterCustomObject({ ...ids, name }).catch(() => undefined);
        return false;
      } catch (e) {
        return /denied the request/.test(String((e as { body?: unknown }).body));
      }
    });
  });

  after(async () => {
    await webhooks.deleteValidatingWebhookConfiguration({ name: webhookName }).catch(() => undefined);
    await a.custom
      .deleteCollectionClusterCustomObject({ ...ids, labelSelector: `${LABEL}=${run}` })
      .catch(() => undefined);
    await statusFn?.close();
    await admissionFn?.close();
    assertNoSecret(
      [...statusLog.lines, ...admissionLog.lines, ...responses].join('\n'),
      [secretValue],
      'function logs and responses',
    );
  });

  it('is refused while used, and allowed after the last consumer and mirror are gone and a refresh emptied status.namespaces', async () => {
    const name = `idst-adm-${run}`;
    await a.custom.createClusterCustomObject({ ...ids, body: identityBody(name) });
    const [withConsumer, withMirror] = [await ns.create(), await ns.create()];
    await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: withConsumer,
      plural: 'terraformclusters',
      body: {
        apiVersion: API_VERSION,
        kind: 'TerraformCluster',
        metadata: { name: 'user' },
        spec: { identityRef: { name } },
      },
    });
    // A mirror whose users are gone but which is still there (owned by a ConfigMap that stays).
    const cm = await a.core.createNamespacedConfigMap({
      namespace: withMirror,
      body: { metadata: { name: 'holder' } },
    });
    const source = await a.core.readNamespacedSecret({ namespace: src, name: 'creds' });
    await a.core.createNamespacedSecret({
      namespace: withMirror,
      body: desiredMirror(name, withMirror, source.data, {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        name: 'holder',
        uid: cm.metadata!.uid!,
      }),
    });

    await refreshAll();
    assert.deepEqual((await read(name)).status?.namespaces, [withConsumer, withMirror].sort());
    let refusal = await tryDelete(name);
    assert.match(
      refusal ?? 'deleted',
      new RegExp(`in use in namespace\\(s\\) ${[withConsumer, withMirror].sort().join(', ')}`),
    );

    // Last consumer gone; the refresh still sees the mirror, so the delete is still refused.
    await a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: withConsumer,
      plural: 'terraformclusters',
      name: 'user',
    });
    await refreshAll();
    assert.deepEqual((await read(name)).status?.namespaces, [withMirror]);
    refusal = await tryDelete(name);
    assert.match(refusal ?? 'deleted', new RegExp(`in use in namespace\\(s\\) ${withMirror}`));

    // Mirror gone, but status.namespaces is only emptied by the next refresh: still refused.
    await a.core.deleteNamespacedSecret({ namespace: withMirror, name: mirrorName(name) });
    refusal = await tryDelete(name);
    assert.match(refusal ?? 'deleted', /in use/, 'refused until the next refresh');

    await refreshAll();
    assert.deepEqual((await read(name)).status?.namespaces, []);
    assert.equal(await tryDelete(name), undefined, 'allowed once unused');
    await eventually('the identity to be gone', async () =>
      read(name).then(
        () => false,
        (e: unknown) => apiStatus(e) === 404,
      ),
    );
  });
});
