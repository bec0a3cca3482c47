/**
 * Privilege: every way we found for a user who may NOT get the operator's
 * source Secret to still obtain an identity pointing at it, or to widen an identity that does
 * to a new namespace, tried through the real API server with the real webhook registered —
 * one table, one row per attempt, each denied (or, for the status subresource, accepted with
 * the spec left as it was). One more row documents the one way that is allowed by design:
 * whoever may label namespaces can label one into a selector identity's set (SPEC §2;
 * docs/deploy-knative.md, "Selector identities trust namespace labels").
 *
 * Set-up as in admission.test.ts: the function runs in-process over HTTPS as a
 * least-privilege user, a ValidatingWebhookConfiguration points the API server at it with an
 * objectSelector on this run's label (so other files' identities are not sent to it), and
 * every attempt is a raw request made with the attacker's client certificate.
 */
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { after, before, describe, it } from 'node:test';
import {
  AdmissionregistrationV1Api,
  KubeConfig,
  RbacAuthorizationV1Api,
  type V1PolicyRule,
} from '@kubernetes/client-node';
import { start } from '../../functions/admission/index.ts';
import { isNamespaceAllowed } from '../../functions/lib/allowed-namespaces.ts';
import { API_VERSION, GROUP, IDENTITY_KIND, IDENTITY_PLURAL, VERSION } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { webhookConfiguration } from '../../scripts/system/webhook.ts';
import { admin, asUser, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';

const sfx = suffix();
const LABEL = 'captf-test/privilege';
const TIER = `captf-test/tier-${sfx}`;
const a = admin();
const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
const ns = namespaces('priv');
const cap = captureLogger('admission');
const planted = [sentinel(), sentinel(), sentinel()];
const seen: string[] = [];

const webhookName = `captf-privilege-test-${sfx}`;
const fnUser = `captf-privilege-fn-${sfx}`;
const malloryName = `mallory-${sfx}`;
const readerName = `reader-${sfx}`;
const clusterObjects: string[] = [];

let fn: FunctionHandle;
let secretsNs: string; // the operator's Secrets: creds, other-creds
let malloryNs: string; // a namespace where mallory may get Secrets: her own creds
let tenantA: string;
let tenantB: string;
let mallory: string; // kubeconfig paths
let labeller: string;

/** An answer of the API server to a raw request. */
interface ApiAnswer {
  status: number;
  body: Record<string, unknown>;
  message: string;
}

/** A raw request as the kubeconfig's user, as kubectl makes it. */
async function api(
  kubeconfigPath: string,
  method: string,
  path: string,
  opts: { body?: unknown; contentType?: string; headers?: Record<string, string> } = {},
): Promise<ApiAnswer> {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const url = new URL(path, kc.getCurrentCluster()!.server);
  const req: RequestOptions = {
    method,
    hostname: url.hostname,
    port: url.port,
    path: url.pathname + url.search,
    headers: { 'content-type': opts.contentType ?? 'application/json', accept: 'application/json', ...opts.headers },
  };
  await kc.applyToHTTPSOptions(req);
  return new Promise((resolve, reject) => {
    const r = httpsRequest(req, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let body: Record<string, unknown>;
        try {
          body = JSON.parse(text) as Record<string, unknown>;
        } catch {
          body = { text };
        }
        const message = typeof body.message === 'string' ? body.message : text.slice(0, 500);
        seen.push(message);
        resolve({ status: res.statusCode ?? 0, body, message });
      });
    });
    r.on('error', reject);
    r.end(opts.body === undefined ? undefined : typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body));
  });
}

const ids = { group: GROUP, version: VERSION, plural: IDENTITY_PLURAL };
const idPath = (name?: string, tail = '') =>
  `/apis/${GROUP}/${VERSION}/${IDENTITY_PLURAL}${name ? `/${name}` : ''}${tail}`;
const identity = (name: string, spec: Record<string, unknown>, labels: Record<string, string> = {}) => ({
  apiVersion: API_VERSION,
  kind: IDENTITY_KIND,
  metadata: { name, labels: { [LABEL]: sfx, ...labels } },
  spec,
});
type Stored = { metadata: { resourceVersion: string; labels?: Record<string, string> }; spec: Record<string, unknown> };
const read = async (name: string) => (await a.custom.getClusterCustomObject({ ...ids, name })) as Stored;
const exists = (name: string) =>
  read(name).then(
    () => true,
    () => false,
  );

async function clusterRole(name: string, rules: V1PolicyRule[], subject: { kind: 'User' | 'Group'; name: string }) {
  await rbac.createClusterRole({ body: { metadata: { name }, rules } });
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name },
      subjects: [{ ...subject, apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
  clusterObjects.push(name);
}

async function role(namespace: string, name: string, rule: V1PolicyRule, user: string) {
  await rbac.createNamespacedRole({ namespace, body: { metadata: { name }, rules: [rule] } });
  await rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name },
      subjects: [{ kind: 'User', name: user, apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
}

/** The identities the operator made, which the attacker tries to point or widen. */
const OPERATOR = {
  list: `op-list-${sfx}`,
  selector: `op-sel-${sfx}`,
  mixed: `op-mixed-${sfx}`,
  forced: `op-forced-${sfx}`,
};

before(async () => {
  [secretsNs, malloryNs, tenantA, tenantB] = await Promise.all([ns.create(), ns.create(), ns.create(), ns.create()]);
  for (const [namespace, name, value] of [
    [secretsNs, 'creds', planted[0]!],
    [secretsNs, 'other-creds', planted[1]!],
    [malloryNs, 'creds', planted[2]!],
  ] as const) {
    await a.core.createNamespacedSecret({ namespace, body: { metadata: { name }, stringData: { token: value } } });
  }

  await clusterRole(
    `captf-privilege-fn-${sfx}`,
    [
      { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
      { apiGroups: [GROUP], resources: ['terraformclusters', 'terraformmachines'], verbs: ['list'] },
      { apiGroups: [''], resources: ['namespaces'], verbs: ['get'] },
    ],
    { kind: 'User', name: fnUser },
  );
  // mallory may do anything to identities and their status, and get Secrets in her own namespace only.
  await clusterRole(
    `captf-privilege-mallory-${sfx}`,
    [
      {
        apiGroups: [GROUP],
        resources: [IDENTITY_PLURAL, `${IDENTITY_PLURAL}/status`],
        verbs: ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'],
      },
    ],
    { kind: 'User', name: malloryName },
  );
  await role(malloryNs, 'own-secrets', { apiGroups: [''], resources: ['secrets'], verbs: ['get'] }, malloryName);
  // A user who may read the operator's Secret (whom mallory would like to be).
  await role(secretsNs, 'reader', { apiGroups: [''], resources: ['secrets'], verbs: ['get'] }, readerName);
  // Whoever may label namespaces (the security notes: cluster admins, or whoever is granted this).
  const labellerName = `labeller-${sfx}`;
  await clusterRole(
    `captf-privilege-labeller-${sfx}`,
    [{ apiGroups: [''], resources: ['namespaces'], verbs: ['get', 'patch'] }],
    { kind: 'User', name: labellerName },
  );
  [mallory, labeller] = await Promise.all([
    asUser(malloryName).then((u) => u.kubeconfigPath),
    asUser(labellerName).then((u) => u.kubeconfigPath),
  ]);

  const dir = mkdtempSync(join(tmpdir(), 'captf-priv-'));
  const { leaf, caPem } = await createWebhookPair(dir, `captf-privilege-ca-${sfx}`);
  const fnKc = new KubeConfig();
  fnKc.loadFromFile((await asUser(fnUser)).kubeconfigPath);
  fn = await start({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: fnKc,
    logger: cap.logger,
    env: { CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
  });
  await a.kc.makeApiClient(AdmissionregistrationV1Api).createValidatingWebhookConfiguration({
    body: webhookConfiguration({
      url: `https://127.0.0.1:${fn.port}`,
      caBundlePem: caPem,
      name: webhookName,
      matchLabels: { [LABEL]: sfx },
    }),
  });

  const ref = { secretRef: { name: 'creds', namespace: secretsNs } };
  const inTier = { matchExpressions: [{ key: TIER, operator: 'In', values: ['gold'] }] };
  // Created by the admin; the first one also waits until the webhook is called.
  await eventually('the webhook to be active', async () => {
    const probe = `probe-${suffix()}`;
    const r = await api(mallory, 'POST', idPath(), { body: identity(probe, ref) });
    if (r.status === 201) await a.custom.deleteClusterCustomObject({ ...ids, name: probe });
    return r.status === 403 && /denied the request/.test(r.message);
  });
  for (const [name, allowedNamespaces] of [
    [OPERATOR.list, { list: [tenantA] }],
    [OPERATOR.selector, { selector: inTier }],
    [OPERATOR.mixed, { list: [tenantA], selector: { matchLabels: { [TIER]: 'gold' } } }],
    [OPERATOR.forced, { list: [tenantA] }],
  ] as const) {
    await a.custom.createClusterCustomObject({ ...ids, body: identity(name, { ...ref, allowedNamespaces }) });
  }
  await eventually('RBAC for mallory on her own Secret', async () => {
    const r = await api(mallory, 'GET', `/api/v1/namespaces/${malloryNs}/secrets/creds`);
    return r.status === 200;
  });
});

after(async () => {
  await a.kc
    .makeApiClient(AdmissionregistrationV1Api)
    .deleteValidatingWebhookConfiguration({ name: webhookName })
    .catch(() => undefined);
  await a.custom
    .deleteCollectionClusterCustomObject({ ...ids, labelSelector: `${LABEL}=${sfx}` })
    .catch(() => undefined);
  for (const name of clusterObjects) {
    await rbac.deleteClusterRoleBinding({ name }).catch(() => undefined);
    await rbac.deleteClusterRole({ name }).catch(() => undefined);
  }
  await fn?.close();
});

/** What one row saw, for the table. */
type Outcome = string;

/** Asserts the webhook denied the request for want of Secret access, naming mallory. */
function deniedForSecret(r: ApiAnswer, secret = `${secretsNs}/creds`): Outcome {
  assert.equal(r.status, 403, `expected 403, got ${r.status}: ${r.message}`);
  assert.match(r.message, /admission webhook "identities\.captf-credentials\.local" denied the request/);
  assert.ok(r.message.includes(`user "${malloryName}" may not get Secret ${secret}`), r.message);
  return `403 ${r.message.replace(/^.*denied the request: /, '').slice(0, 160)}`;
}

/** Runs an attempt on an operator identity and checks the stored object did not change at all. */
async function unchanged(name: string, attempt: () => Promise<Outcome>): Promise<Outcome> {
  const before = await read(name);
  const outcome = await attempt();
  const now = await read(name);
  assert.equal(now.metadata.resourceVersion, before.metadata.resourceVersion, `${name} was written`);
  assert.ok(isDeepStrictEqual(now.spec, before.spec), `${name}'s spec changed`);
  return outcome;
}

const wider = (o: Stored) => ({ ...o, spec: { ...o.spec, allowedNamespaces: { list: [tenantA, tenantB] } } });

/** One attempt: a name, and the attempt itself, which asserts its outcome and describes it. */
interface Row {
  what: string;
  attempt: () => Promise<Outcome>;
}

const ROWS: Row[] = [
  {
    what: 'a second identity on the same Secret (CREATE)',
    attempt: async () => {
      const name = `mal-second-${sfx}`;
      const r = await api(mallory, 'POST', idPath(), {
        body: identity(name, {
          secretRef: { name: 'creds', namespace: secretsNs },
          allowedNamespaces: { list: [tenantB] },
        }),
      });
      assert.equal(await exists(name), false);
      return deniedForSecret(r);
    },
  },
  {
    what: 'the same CREATE as a dry run (dryRun=All)',
    attempt: async () => {
      const name = `mal-dry-${sfx}`;
      const r = await api(mallory, 'POST', idPath(undefined, '?dryRun=All'), {
        body: identity(name, { secretRef: { name: 'creds', namespace: secretsNs } }),
      });
      assert.equal(await exists(name), false);
      return deniedForSecret(r);
    },
  },
  {
    what: 'a non-canonical reference to the Secret (upper case, trailing dot)',
    attempt: async () => {
      const outcomes: string[] = [];
      for (const secretRef of [
        { name: 'CREDS', namespace: secretsNs },
        { name: 'creds.', namespace: secretsNs },
        { name: 'creds', namespace: `${secretsNs}.` },
      ]) {
        const r = await api(mallory, 'POST', idPath(), { body: identity(`mal-odd-${suffix()}`, { secretRef }) });
        assert.ok(r.status === 422 || r.status === 403, `${JSON.stringify(secretRef)}: ${r.status} ${r.message}`);
        outcomes.push(String(r.status));
      }
      return `refused (${outcomes.join(', ')}): invalid names`;
    },
  },
  {
    what: 'two steps: an identity on her own Secret (allowed), then secretRef pointed at the operator’s',
    attempt: async () => {
      const name = `mal-own-${sfx}`;
      const created = await api(mallory, 'POST', idPath(), {
        body: identity(name, {
          secretRef: { name: 'creds', namespace: malloryNs },
          allowedNamespaces: { list: [tenantB] },
        }),
      });
      assert.equal(created.status, 201, `step 1 (her own Secret) is allowed: ${created.message}`);
      return unchanged(name, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(name), {
            contentType: 'application/merge-patch+json',
            body: { spec: { secretRef: { name: 'other-creds', namespace: secretsNs } } },
          }),
          `${secretsNs}/other-creds`,
        ),
      );
    },
  },
  {
    what: 'changing only secretRef.namespace (creds in her namespace → creds in the operator’s)',
    attempt: async () =>
      unchanged(`mal-own-${sfx}`, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(`mal-own-${sfx}`), {
            contentType: 'application/merge-patch+json',
            body: { spec: { secretRef: { namespace: secretsNs } } },
          }),
        ),
      ),
  },
  {
    what: 'two steps: drop the selector (a narrowing, allowed), then put it back',
    attempt: async () => {
      const name = OPERATOR.mixed;
      const dropped = await api(mallory, 'PATCH', idPath(name), {
        contentType: 'application/merge-patch+json',
        body: { spec: { allowedNamespaces: { selector: null } } },
      });
      assert.equal(dropped.status, 200, `step 1 (narrowing) is allowed: ${dropped.message}`);
      return unchanged(name, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(name), {
            contentType: 'application/merge-patch+json',
            body: { spec: { allowedNamespaces: { selector: { matchLabels: { [TIER]: 'gold' } } } } },
          }),
        ),
      );
    },
  },
  {
    what: 'list → selector (merge patch)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(OPERATOR.list), {
            contentType: 'application/merge-patch+json',
            body: { spec: { allowedNamespaces: { list: null, selector: { matchLabels: { [TIER]: 'gold' } } } } },
          }),
        ),
      ),
  },
  {
    what: 'matchExpressions that match more: In (gold) → In (gold, silver)',
    attempt: async () =>
      unchanged(OPERATOR.selector, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(OPERATOR.selector), {
            contentType: 'application/merge-patch+json',
            body: {
              spec: {
                allowedNamespaces: {
                  selector: { matchExpressions: [{ key: TIER, operator: 'In', values: ['gold', 'silver'] }] },
                },
              },
            },
          }),
        ),
      ),
  },
  {
    what: 'matchExpressions that match more: In (gold) → Exists, and → NotIn (bronze)',
    attempt: async () =>
      unchanged(OPERATOR.selector, async () => {
        const outcomes: string[] = [];
        for (const expr of [
          { key: TIER, operator: 'Exists' },
          { key: TIER, operator: 'NotIn', values: ['bronze'] },
        ]) {
          const r = await api(mallory, 'PATCH', idPath(OPERATOR.selector), {
            contentType: 'application/merge-patch+json',
            body: { spec: { allowedNamespaces: { selector: { matchExpressions: [expr] } } } },
          });
          outcomes.push(deniedForSecret(r).slice(0, 3));
        }
        return outcomes.join(', ');
      }),
  },
  {
    what: 'server-side apply of a wider list (fieldManager=mallory, force=true)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(OPERATOR.list, '?fieldManager=mallory&force=true'), {
            contentType: 'application/apply-patch+yaml',
            body: {
              apiVersion: API_VERSION,
              kind: IDENTITY_KIND,
              metadata: { name: OPERATOR.list },
              spec: { allowedNamespaces: { list: [tenantA, tenantB] } },
            },
          }),
        ),
      ),
  },
  {
    what: 'JSON patch: add a name to the list',
    attempt: async () =>
      unchanged(OPERATOR.list, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(OPERATOR.list), {
            contentType: 'application/json-patch+json',
            body: [{ op: 'add', path: '/spec/allowedNamespaces/list/-', value: tenantB }],
          }),
        ),
      ),
  },
  {
    what: 'JSON patch: replace secretRef with a test that passes first',
    attempt: async () =>
      unchanged(OPERATOR.list, async () =>
        deniedForSecret(
          await api(mallory, 'PATCH', idPath(OPERATOR.list), {
            contentType: 'application/json-patch+json',
            body: [
              { op: 'test', path: '/spec/secretRef/name', value: 'creds' },
              { op: 'replace', path: '/spec/secretRef/name', value: 'other-creds' },
            ],
          }),
          `${secretsNs}/other-creds`,
        ),
      ),
  },
  {
    what: 'strategic merge patch (not applicable to custom resources)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const r = await api(mallory, 'PATCH', idPath(OPERATOR.list), {
          contentType: 'application/strategic-merge-patch+json',
          body: { spec: { allowedNamespaces: { list: [tenantA, tenantB] } } },
        });
        assert.equal(r.status, 415, `${r.status}: ${r.message}`);
        return `415 ${r.message.slice(0, 120)}`;
      }),
  },
  {
    what: '`kubectl replace`: PUT of the whole object, widened, with its resourceVersion',
    attempt: async () =>
      unchanged(OPERATOR.list, async () =>
        deniedForSecret(await api(mallory, 'PUT', idPath(OPERATOR.list), { body: wider(await read(OPERATOR.list)) })),
      ),
  },
  {
    what: 'PUT without a resourceVersion (an unconditional replace), widened',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const o = wider(await read(OPERATOR.list));
        const body = { ...o, metadata: { ...o.metadata, resourceVersion: undefined } };
        // Custom resources allow no unconditional update: refused before admission is asked.
        const r = await api(mallory, 'PUT', idPath(OPERATOR.list), { body });
        assert.equal(r.status, 422, r.message);
        assert.match(r.message, /metadata\.resourceVersion: Invalid value: 0: must be specified for an update/);
        return `422 ${r.message.replace(/^.*is invalid: /, '')}`;
      }),
  },
  {
    what: 'a widening UPDATE as a dry run (dryRun=All)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () =>
        deniedForSecret(
          await api(mallory, 'PUT', idPath(OPERATOR.list, '?dryRun=All'), { body: wider(await read(OPERATOR.list)) }),
        ),
      ),
  },
  {
    what: 'the status subresource: PUT …/status and a merge patch of it carrying a wider spec',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const o = wider(await read(OPERATOR.list));
        const put = await api(mallory, 'PUT', idPath(OPERATOR.list, '/status'), { body: o });
        const patch = await api(mallory, 'PATCH', idPath(OPERATOR.list, '/status'), {
          contentType: 'application/merge-patch+json',
          body: { spec: { allowedNamespaces: { list: [tenantA, tenantB] } } },
        });
        // The status subresource ignores spec: both succeed and write nothing (same resourceVersion).
        assert.equal(put.status, 200, put.message);
        assert.equal(patch.status, 200, patch.message);
        return `${put.status}/${patch.status}, spec and resourceVersion unchanged: the status subresource ignores spec`;
      }),
  },
  {
    what: 'dropping the label the test webhook selects on, in the same widening update',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const o = wider(await read(OPERATOR.list));
        const body = { ...o, metadata: { ...o.metadata, labels: {} } };
        // The API server calls the webhook when the old OR the new object matches its objectSelector.
        return deniedForSecret(await api(mallory, 'PUT', idPath(OPERATOR.list), { body }));
      }),
  },
  {
    what: 'impersonating a user who may read the Secret (Impersonate-User)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const r = await api(mallory, 'PUT', idPath(OPERATOR.list), {
          body: wider(await read(OPERATOR.list)),
          headers: { 'Impersonate-User': readerName },
        });
        assert.equal(r.status, 403, r.message);
        assert.match(r.message, /cannot impersonate/);
        return `403 ${r.message.slice(0, 120)}`;
      }),
  },
  {
    what: '`kubectl replace --force`: delete (allowed while unused), then create it wider',
    attempt: async () => {
      const name = OPERATOR.forced;
      const o = wider(await read(name));
      const deleted = await api(mallory, 'DELETE', idPath(name));
      assert.equal(deleted.status, 200, `deleting an unused identity needs no Secret access: ${deleted.message}`);
      await eventually('the identity to be gone', async () => !(await exists(name)));
      const body = { ...o, metadata: { name, labels: o.metadata.labels } };
      const r = await api(mallory, 'POST', idPath(), { body });
      assert.equal(await exists(name), false, 'not re-created');
      return `delete 200, create ${deniedForSecret(r)}`;
    },
  },
];

describe('privilege: a user who may not get the Secret cannot point an identity at it or widen one', () => {
  it('every attempt in the table is refused; relabelling a namespace is the one way, by design', async (t) => {
    const failures: string[] = [];
    let n = 0;
    for (const row of ROWS) {
      n++;
      try {
        const outcome = await row.attempt();
        t.diagnostic(`${String(n).padStart(2)}. ${row.what}: ${outcome}`);
      } catch (err) {
        failures.push(`${row.what}: ${(err as Error).message}`);
        t.diagnostic(`${String(n).padStart(2)}. ${row.what}: FAILED ${(err as Error).message}`);
      }
    }

    // Allowed by design (SPEC §2): the webhook never sees namespaces; whoever may label them
    // decides which namespaces a selector identity allows. Mallory cannot; the labeller can.
    const sel = await read(OPERATOR.selector);
    const allowed = async () =>
      isNamespaceAllowed(sel.spec.allowedNamespaces as never, {
        name: tenantB,
        labels: (await a.core.readNamespace({ name: tenantB })).metadata?.labels ?? {},
      });
    assert.equal(await allowed(), false, `${tenantB} starts outside the selector's set`);
    const byMallory = await api(mallory, 'PATCH', `/api/v1/namespaces/${tenantB}`, {
      contentType: 'application/merge-patch+json',
      body: { metadata: { labels: { [TIER]: 'gold' } } },
    });
    assert.equal(byMallory.status, 403, 'mallory may not label namespaces');
    const reviews = cap.entries().filter((e) => e.message === 'reviewed').length;
    const byLabeller = await api(labeller, 'PATCH', `/api/v1/namespaces/${tenantB}`, {
      contentType: 'application/merge-patch+json',
      body: { metadata: { labels: { [TIER]: 'gold' } } },
    });
    assert.equal(byLabeller.status, 200, byLabeller.message);
    assert.equal(await allowed(), true, `${tenantB} is now in ${OPERATOR.selector}'s set`);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(cap.entries().filter((e) => e.message === 'reviewed').length, reviews, 'no review was made');
    t.diagnostic(
      `${String(n + 1).padStart(2)}. ALLOWED BY DESIGN — a user who may patch namespaces labels ${tenantB} ${TIER}=gold: ` +
        `it joins the selector identity's set with no admission review (mallory, who may not label namespaces, got ${byMallory.status})`,
    );
    t.diagnostic(`${ROWS.length} bypass attempts, ${failures.length} not refused`);
    assert.deepEqual(failures, []);
  });

  it('no Secret value in any answer the attacker saw or in the webhook log', () => {
    assertNoSecret(seen.join('\n'), planted, 'API answers');
    assertNoSecret(cap.lines.join('\n'), planted, 'admission logs');
  });
});
