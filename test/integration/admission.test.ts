/**
 * The admission matrix through the real API server: the function runs in-process
 * over HTTPS (serving cert from a test CA), a ValidatingWebhookConfiguration points the API
 * server at it, and every request is made by a client-certificate user with real RBAC.
 * The webhook only sees identities labeled with this run's label, so other test files'
 * identities are never affected.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, mkdtempSync } from 'node:fs';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, it } from 'node:test';
import {
  AdmissionregistrationV1Api,
  KubeConfig,
  RbacAuthorizationV1Api,
  type V1PolicyRule,
} from '@kubernetes/client-node';
import { start } from '../../functions/admission/index.ts';
import {
  API_VERSION,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, type Clients } from '../../functions/lib/kube.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { webhookConfiguration } from '../../scripts/system/webhook.ts';
import { builtKubectlPath } from '../../scripts/tools/build.ts';
import { admin, asUser, controlPlaneDir, eventually, namespaces, suffix } from '../helpers/cluster.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';

const sfx = suffix();
const LABEL = 'captf-test/admission';
const a = admin();
const rbac = a.kc.makeApiClient(RbacAuthorizationV1Api);
const ns = namespaces('adm');
const cap = captureLogger('admission');
const secretValues = [sentinel(), sentinel(), sentinel()];
/** Every message a user saw, scanned for planted Secret values at the end. */
const seen: string[] = [];

const webhookName = `captf-admission-test-${sfx}`;
const adminUser = `captf-admission-${sfx}`;
const editors = `captf-admission-editors-${sfx}`;
const readers = `captf-admission-readers-${sfx}`;
const clusterObjects: { kind: 'ClusterRole' | 'ClusterRoleBinding'; name: string }[] = [];

let fn: FunctionHandle;
let secretsNs: string;
let otherSecretsNs: string;
let consumerNs: string;
const users: Record<'direct' | 'member' | 'scoped' | 'nobody' | 'lister', Clients & { kubeconfigPath: string }> =
  {} as never;

const ids = { group: GROUP, version: VERSION, plural: IDENTITY_PLURAL };
const body = (name: string, spec: Record<string, unknown>, labels: Record<string, string> = {}) => ({
  apiVersion: API_VERSION,
  kind: IDENTITY_KIND,
  metadata: { name, labels: { [LABEL]: sfx, ...labels } as Record<string, string> },
  spec,
});
const ref = (name = 'creds', namespace = secretsNs) => ({ secretRef: { name, namespace } });
const create = (c: Clients, b: object, dryRun?: boolean) =>
  c.custom.createClusterCustomObject({ ...ids, body: b, ...(dryRun ? { dryRun: 'All' } : {}) });
type Identity = TerraformClusterIdentity;
const read = async (name: string) => (await a.custom.getClusterCustomObject({ ...ids, name })) as Identity;
/** Read-modify-write as `c` (an UPDATE through the webhook). */
const update = async (c: Clients, name: string, change: (o: Identity) => void) => {
  const o = (await c.custom.getClusterCustomObject({ ...ids, name })) as Identity;
  change(o);
  return c.custom.replaceClusterCustomObject({ ...ids, name, body: o });
};
const remove = (c: Clients, name: string) => c.custom.deleteClusterCustomObject({ ...ids, name });

/** Resolves to the API error's status and message when `p` rejects; fails the test if it resolves. */
async function rejection(p: Promise<unknown>): Promise<{ code: number | undefined; message: string }> {
  try {
    await p;
  } catch (err) {
    const raw = (err as { body?: unknown }).body;
    let message = typeof raw === 'string' ? raw : JSON.stringify(raw ?? String(err));
    try {
      message = (JSON.parse(message) as { message?: string }).message ?? message;
    } catch {
      /* keep raw */
    }
    seen.push(message);
    return { code: apiStatus(err), message };
  }
  assert.fail('expected the API server to refuse the request');
}

/** Number of SubjectAccessReviews the function's own user has made (from the audit log). */
function sarCount(): number {
  const log = readFileSync(join(controlPlaneDir(), 'logs', 'audit.log'), 'utf8');
  let n = 0;
  for (const line of log.split('\n')) {
    if (!line.includes(adminUser) || !line.includes('subjectaccessreviews')) continue;
    const e = JSON.parse(line) as { stage?: string; user?: { username?: string }; objectRef?: { resource?: string } };
    if (
      e.stage === 'ResponseComplete' &&
      e.user?.username === adminUser &&
      e.objectRef?.resource === 'subjectaccessreviews'
    )
      n++;
  }
  return n;
}

/** The function's "reviewed" log entries since `mark` lines. */
const reviewedSince = (mark: number) =>
  cap
    .entries()
    .slice(mark)
    .filter((e) => e.message === 'reviewed');

/** Expects exactly one review since `mark`, allowed, with no SubjectAccessReview made. */
async function assertNoSar(mark: number, sarsBefore: number, what: string) {
  // Log lines reach the capture stream asynchronously.
  await eventually(`${what}: the review in the function log`, async () => reviewedSince(mark).length > 0, 5_000);
  await new Promise((res) => setTimeout(res, 300));
  const r = reviewedSince(mark);
  assert.equal(r.length, 1, `${what}: one review`);
  assert.equal(r[0]!.subjectAccessReview, false, `${what}: no SubjectAccessReview in the function log`);
  assert.equal(sarCount(), sarsBefore, `${what}: no SubjectAccessReview in the audit log`);
}

async function clusterRole(name: string, rules: V1PolicyRule[], subject: { kind: 'User' | 'Group'; name: string }) {
  await rbac.createClusterRole({ body: { metadata: { name }, rules } });
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name },
      subjects: [{ ...subject, apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
  clusterObjects.push({ kind: 'ClusterRoleBinding', name }, { kind: 'ClusterRole', name });
}

async function role(
  namespace: string,
  name: string,
  rule: V1PolicyRule,
  subject: { kind: 'User' | 'Group'; name: string },
) {
  await rbac.createNamespacedRole({ namespace, body: { metadata: { name }, rules: [rule] } });
  await rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name },
      subjects: [{ ...subject, apiGroup: 'rbac.authorization.k8s.io' }],
    },
  });
}

before(async () => {
  [secretsNs, otherSecretsNs, consumerNs] = await Promise.all([ns.create(), ns.create(), ns.create()]);
  for (const [n, name, v] of [
    [secretsNs, 'creds', 0],
    [secretsNs, 'other-creds', 1],
    [otherSecretsNs, 'creds', 2],
  ] as const) {
    await a.core.createNamespacedSecret({
      namespace: n,
      body: { metadata: { name }, stringData: { token: secretValues[v]! } },
    });
  }

  // The function runs as a least-privilege user (manifests/base/rbac/admission.yaml):
  // SubjectAccessReviews, consumer lists and namespace reads, no Secret access at all.
  await clusterRole(
    `captf-admission-fn-${sfx}`,
    [
      { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
      { apiGroups: [GROUP], resources: ['terraformclusters', 'terraformmachines'], verbs: ['list'] },
      { apiGroups: [''], resources: ['namespaces'], verbs: ['get'] },
    ],
    { kind: 'User', name: adminUser },
  );
  // Every test user may create/update/delete identities and their status; Secret access varies.
  await clusterRole(
    `captf-admission-editors-${sfx}`,
    [
      {
        apiGroups: [GROUP],
        resources: [IDENTITY_PLURAL],
        verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'],
      },
      { apiGroups: [GROUP], resources: [`${IDENTITY_PLURAL}/status`], verbs: ['get', 'update', 'patch'] },
    ],
    { kind: 'Group', name: editors },
  );

  const direct = `direct-${sfx}`,
    scoped = `scoped-${sfx}`,
    lister = `lister-${sfx}`;
  await role(
    secretsNs,
    'get-secrets',
    { apiGroups: [''], resources: ['secrets'], verbs: ['get'] },
    { kind: 'User', name: direct },
  );
  await role(
    secretsNs,
    'readers-get-secrets',
    { apiGroups: [''], resources: ['secrets'], verbs: ['get'] },
    { kind: 'Group', name: readers },
  );
  await role(
    secretsNs,
    'get-creds-only',
    { apiGroups: [''], resources: ['secrets'], verbs: ['get'], resourceNames: ['creds'] },
    { kind: 'User', name: scoped },
  );
  await role(
    secretsNs,
    'list-secrets',
    { apiGroups: [''], resources: ['secrets'], verbs: ['list'] },
    { kind: 'User', name: lister },
  );
  [users.direct, users.member, users.scoped, users.nobody, users.lister] = await Promise.all([
    asUser(direct, [editors]),
    asUser(`member-${sfx}`, [editors, readers]),
    asUser(scoped, [editors]),
    asUser(`nobody-${sfx}`, [editors]),
    asUser(lister, [editors]),
  ]);

  const dir = mkdtempSync(join(tmpdir(), 'captf-adm-'));
  const { leaf, caPem } = await createWebhookPair(dir, `captf-admission-test-ca-${sfx}`);
  const fnKc = new KubeConfig();
  fnKc.loadFromFile((await asUser(adminUser)).kubeconfigPath);
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

  // Wait until the API server calls the webhook (an invalid operator passes the CRD schema,
  // so only the webhook can refuse it), and until RBAC has reached the authorizer.
  await eventually('the webhook to be active', async () => {
    const name = `probe-${suffix()}`;
    try {
      await create(
        a,
        body(name, {
          ...ref(),
          allowedNamespaces: { selector: { matchExpressions: [{ key: 'k', operator: 'Near' }] } },
        }),
      );
      await remove(a, name).catch(() => undefined);
      return false;
    } catch (e) {
      return /denied the request/.test(String((e as { body?: unknown }).body));
    }
  });
  await eventually(
    'RBAC for the lister',
    async () => (await users.lister.core.listNamespacedSecret({ namespace: secretsNs })).items.length === 2,
  );
  await eventually('RBAC for the group member', async () =>
    Boolean(await users.member.core.readNamespacedSecret({ namespace: secretsNs, name: 'creds' })),
  );
  await eventually('RBAC for the function user', async () =>
    Boolean(
      await a.authz
        .createSubjectAccessReview({
          body: {
            spec: {
              user: adminUser,
              resourceAttributes: { group: 'authorization.k8s.io', resource: 'subjectaccessreviews', verb: 'create' },
            },
          },
        })
        .then((r) => r.status?.allowed),
    ),
  );
});

after(async () => {
  await a.kc
    .makeApiClient(AdmissionregistrationV1Api)
    .deleteValidatingWebhookConfiguration({ name: webhookName })
    .catch(() => undefined);
  await a.custom
    .deleteCollectionClusterCustomObject({ ...ids, labelSelector: `${LABEL}=${sfx}` })
    .catch(() => undefined);
  for (const o of clusterObjects) {
    await (
      o.kind === 'ClusterRole'
        ? rbac.deleteClusterRole({ name: o.name })
        : rbac.deleteClusterRoleBinding({ name: o.name })
    ).catch(() => undefined);
  }
  await fn?.close();
});

/** Creates as `c`, retrying while RBAC or the webhook are still settling (allowed cases only). */
const createAllowed = (what: string, c: Clients, b: object) =>
  eventually(what, async () => Boolean(await create(c, b)), 30_000);

describe('admission on CREATE: a SubjectAccessReview for get on the named Secret', () => {
  it('allowed by direct RBAC (a RoleBinding to the user), and the SAR is visible in the audit log', async () => {
    const before = sarCount();
    await createAllowed(
      'direct create',
      users.direct,
      body(`c-direct-${sfx}`, { ...ref(), allowedNamespaces: { list: ['a'] } }),
    );
    await eventually('the SubjectAccessReview in the audit log', async () => sarCount() > before, 10_000);
  });

  it('allowed only through a group', async () => {
    await createAllowed('group create', users.member, body(`c-group-${sfx}`, ref()));
  });

  it('allowed through a Role scoped by resourceNames, for that Secret only', async () => {
    await createAllowed('scoped create', users.scoped, body(`c-scoped-${sfx}`, ref('creds')));
    const r = await rejection(create(users.scoped, body(`c-scoped-other-${sfx}`, ref('other-creds'))));
    assert.match(r.message, new RegExp(`user "scoped-${sfx}" may not get Secret ${secretsNs}/other-creds`));
  });

  it('denied without RBAC, naming user, verb, Secret and rule', async () => {
    const r = await rejection(create(users.nobody, body(`c-nobody-${sfx}`, ref())));
    assert.equal(r.code, 403);
    assert.match(r.message, /admission webhook "identities\.captf-credentials\.local" denied the request/);
    assert.match(
      r.message,
      new RegExp(
        `user "nobody-${sfx}" may not get Secret ${secretsNs}/creds: creating an identity requires permission to get the Secret it names`,
      ),
    );
  });

  it('denied when RBAC grants list but not get', async () => {
    const r = await rejection(create(users.lister, body(`c-lister-${sfx}`, ref())));
    assert.match(r.message, new RegExp(`user "lister-${sfx}" may not get Secret ${secretsNs}/creds`));
  });

  it('a dry-run create is reviewed the same way (denied without RBAC; allowed with it, and nothing stored)', async () => {
    const dry = `c-dry-${sfx}`;
    let mark = cap.lines.length;
    const r = await rejection(create(users.nobody, body(dry, ref()), true));
    assert.match(r.message, new RegExp(`user "nobody-${sfx}" may not get Secret ${secretsNs}/creds`));
    await eventually(
      'the denied dry run in the function log',
      async () =>
        reviewedSince(mark).some((e) => e.dryRun === true && e.subjectAccessReview === true && e.allowed === false),
      5_000,
    );
    mark = cap.lines.length;
    await eventually('dry-run create', async () => Boolean(await create(users.direct, body(dry, ref()), true)), 30_000);
    await eventually(
      'the allowed dry run in the function log',
      async () =>
        reviewedSince(mark).some((e) => e.dryRun === true && e.subjectAccessReview === true && e.allowed === true),
      5_000,
    );
    await assert.rejects(read(dry), (e: unknown) => apiStatus(e) === 404, 'a dry run stores nothing');
  });
});

describe('admission on UPDATE: a SAR only when secretRef changes or allowedNamespaces widens', () => {
  const name = `u-${sfx}`;
  const base = () => ({
    ...ref(),
    allowedNamespaces: {
      list: ['a', 'b'],
      selector: {
        matchLabels: { env: 'prod' },
        matchExpressions: [{ key: 'tier', operator: 'In', values: ['x', 'y'] }],
      },
    },
  });
  const reset = async () => {
    await update(a, name, (o) => {
      o.spec = base();
    });
  };
  before(async () => {
    await createAllowed('the identity to update', a, body(name, base()));
  });

  const denied: [string, (o: Identity) => void, RegExp][] = [
    [
      'secretRef.name changed',
      (o) => {
        o.spec.secretRef = { name: 'other-creds', namespace: secretsNs };
      },
      /changing spec\.secretRef/,
    ],
    [
      'secretRef.namespace changed',
      (o) => {
        o.spec.secretRef = { name: 'creds', namespace: otherSecretsNs };
      },
      /changing spec\.secretRef/,
    ],
    [
      'list gains a name',
      (o) => {
        (o.spec.allowedNamespaces as { list: string[] }).list.push('c');
      },
      /widening spec\.allowedNamespaces \(list gains c\)/,
    ],
    [
      'selector loses a requirement',
      (o) => {
        delete (o.spec.allowedNamespaces as { selector: { matchLabels?: unknown } }).selector.matchLabels;
      },
      /widening/,
    ],
    [
      'selector value changed',
      (o) => {
        (o.spec.allowedNamespaces as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels.env =
          'dev';
      },
      /widening/,
    ],
    [
      'list → selector',
      (o) => {
        o.spec.allowedNamespaces = { selector: { matchLabels: { env: 'prod' } } };
      },
      /widening/,
    ],
  ];
  for (const [what, change, rule] of denied) {
    it(`${what}: SAR needed — denied for a user without Secret access`, async () => {
      await reset();
      const before = sarCount();
      const r = await rejection(update(users.nobody, name, change));
      assert.match(r.message, new RegExp(`user "nobody-${sfx}" may not get Secret`));
      assert.match(r.message, rule);
      await eventually('a SubjectAccessReview in the audit log', async () => sarCount() > before, 10_000);
    });
  }

  it('secretRef.name changed: allowed for a user who may get the new Secret', async () => {
    await reset();
    await eventually(
      'update by direct',
      async () =>
        Boolean(
          await update(users.direct, name, (o) => {
            o.spec.secretRef = { name: 'other-creds', namespace: secretsNs };
          }),
        ),
      30_000,
    );
    assert.equal((await read(name)).spec.secretRef.name, 'other-creds');
  });

  it('secretRef.namespace changed: denied even for a user who may get the old Secret', async () => {
    await reset();
    const r = await rejection(
      update(users.direct, name, (o) => {
        o.spec.secretRef = { name: 'creds', namespace: otherSecretsNs };
      }),
    );
    assert.match(r.message, new RegExp(`may not get Secret ${otherSecretsNs}/creds`));
  });

  const allowed: [string, (o: Identity) => void][] = [
    [
      'list loses a name',
      (o) => {
        (o.spec.allowedNamespaces as { list: string[] }).list = ['a'];
      },
    ],
    [
      'selector unchanged (requirements and values reordered)',
      (o) => {
        const sel = (o.spec.allowedNamespaces as { selector: { matchExpressions: { values: string[] }[] } }).selector;
        sel.matchExpressions[0]!.values = ['y', 'x'];
      },
    ],
    [
      'selector gains a requirement',
      (o) => {
        (o.spec.allowedNamespaces as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels.team =
          'blue';
      },
    ],
    [
      'metadata-only update (label and annotation)',
      (o) => {
        o.metadata.labels = { ...o.metadata.labels, extra: 'yes' };
        o.metadata.annotations = { note: 'hello' };
      },
    ],
  ];
  for (const [what, change] of allowed) {
    it(`${what}: no SAR — allowed for a user without Secret access`, async () => {
      await reset();
      const mark = cap.lines.length;
      const sars = sarCount();
      await update(users.nobody, name, change);
      await assertNoSar(mark, sars, what);
    });
  }

  it('unset → selector: {} is widening: denied without Secret access, allowed with it', async () => {
    await update(a, name, (o) => {
      delete (o.spec as { allowedNamespaces?: unknown }).allowedNamespaces;
    });
    const r = await rejection(
      update(users.nobody, name, (o) => {
        o.spec.allowedNamespaces = { selector: {} };
      }),
    );
    assert.match(r.message, /widening spec\.allowedNamespaces \(a selector was added\)/);
    await update(users.member, name, (o) => {
      o.spec.allowedNamespaces = { selector: {} };
    });
    assert.deepEqual((await read(name)).spec.allowedNamespaces, { selector: {} });
  });

  it('a status update is never reviewed', async () => {
    const mark = cap.lines.length;
    const sars = sarCount();
    const o = (await users.nobody.custom.getClusterCustomObject({ ...ids, name })) as Identity;
    await users.nobody.custom.replaceClusterCustomObjectStatus({
      ...ids,
      name,
      body: { ...o, status: { namespaces: ['x-status'] } },
    });
    await new Promise((res) => setTimeout(res, 500));
    assert.equal(reviewedSince(mark).length, 0, 'the webhook was not called');
    assert.equal(sarCount(), sars);
    await a.custom.replaceClusterCustomObjectStatus({
      ...ids,
      name,
      body: { ...(await read(name)), status: { namespaces: [] } },
    });
  });
});

describe('admission rejects invalid forms', () => {
  it('allowedNamespaces: {} is rejected by the CRD CEL rule before the webhook', async () => {
    const mark = cap.lines.length;
    const r = await rejection(create(a, body(`r-empty-${sfx}`, { ...ref(), allowedNamespaces: {} })));
    assert.equal(r.code, 422);
    assert.match(r.message, /allowedNamespaces: \{\} is ambiguous/);
    await new Promise((res) => setTimeout(res, 500));
    assert.equal(reviewedSince(mark).length, 0, 'the webhook was not called');
  });

  for (const [what, expr, msg] of [
    [
      'an unknown operator',
      { key: 'env', operator: 'Near', values: ['x'] },
      /matchExpressions\[0\]\.operator: "Near" is not a valid operator/,
    ],
    ['In without values', { key: 'env', operator: 'In' }, /values: must be non-empty when operator is In/],
    [
      'Exists with values',
      { key: 'env', operator: 'Exists', values: ['x'] },
      /values: must be empty when operator is Exists/,
    ],
  ] as const) {
    it(`a selector with ${what} is rejected by the webhook, naming the bad part`, async () => {
      const r = await rejection(
        create(
          a,
          body(`r-op-${suffix()}`, { ...ref(), allowedNamespaces: { selector: { matchExpressions: [expr] } } }),
        ),
      );
      assert.equal(r.code, 422);
      assert.match(r.message, msg);
    });
  }

  it('an invalid Secret name is rejected by the webhook', async () => {
    const r = await rejection(
      create(a, body(`r-name-${sfx}`, { secretRef: { name: 'Not_Valid', namespace: secretsNs } })),
    );
    assert.match(r.message, /spec\.secretRef\.name: "Not_Valid" is not a valid Secret name/);
  });
});

describe('admission on DELETE: refused while the identity is in use', () => {
  it('refused while status.namespaces is non-empty (set by the admin through the status subresource)', async () => {
    const name = `d-status-${sfx}`;
    await createAllowed('identity', a, body(name, ref()));
    await a.custom.replaceClusterCustomObjectStatus({
      ...ids,
      name,
      body: { ...(await read(name)), status: { namespaces: ['team-b', 'team-a'] } },
    });
    const r = await rejection(remove(users.nobody, name));
    assert.match(
      r.message,
      new RegExp(
        `user "nobody-${sfx}" may not delete TerraformClusterIdentity "${name}": it is in use in namespace\\(s\\) team-a, team-b`,
      ),
    );
    await a.custom.replaceClusterCustomObjectStatus({
      ...ids,
      name,
      body: { ...(await read(name)), status: { namespaces: [] } },
    });
    await remove(users.nobody, name);
  });

  it('refused with an empty status while a live consumer references it; allowed once it is gone', async () => {
    const name = `d-live-${sfx}`;
    await createAllowed('identity', a, body(name, ref()));
    await a.custom.createNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: consumerNs,
      plural: 'terraformclusters',
      body: {
        apiVersion: API_VERSION,
        kind: 'TerraformCluster',
        metadata: { name: 'user' },
        spec: { identityRef: { name } },
      },
    });
    assert.deepEqual((await read(name)).status ?? {}, {}, 'status is empty');
    const r = await rejection(remove(users.nobody, name));
    assert.match(r.message, new RegExp(`in use in namespace\\(s\\) ${consumerNs};`));
    await a.custom.deleteNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      namespace: consumerNs,
      plural: 'terraformclusters',
      name: 'user',
    });
    await eventually('delete once unused', async () => Boolean(await remove(users.nobody, name)), 30_000);
  });

  it('allowed when unused', async () => {
    const name = `d-unused-${sfx}`;
    await createAllowed('identity', a, body(name, ref()));
    await remove(users.nobody, name);
    await assert.rejects(read(name), (e: unknown) => apiStatus(e) === 404);
  });
});

describe('ratcheting: an UPDATE that leaves spec unchanged is admitted without validation', () => {
  // `operator: In` without values passes the CRD schema (and its CEL rule, which only refuses
  // `{}`) but not the webhook. Created without this run's label, the webhook's objectSelector
  // does not match, so the API server stores it as if the webhook had been down.
  const name = `rat-${sfx}`;
  const FINALIZER = 'test.captf.io/hold';
  const invalid = () => ({
    ...ref(),
    allowedNamespaces: { selector: { matchExpressions: [{ key: 'tier', operator: 'In' }] } },
  });
  after(async () => {
    await a.custom
      .patchClusterCustomObject({ ...ids, name, body: [{ op: 'replace', path: '/metadata/finalizers', value: [] }] })
      .catch(() => undefined);
  });

  it('an identity stored with a spec the webhook rejects gets a label, is deleted, and loses its finalizer', async () => {
    await a.custom.createClusterCustomObject({
      ...ids,
      body: {
        apiVersion: API_VERSION,
        kind: IDENTITY_KIND,
        metadata: { name, finalizers: [FINALIZER] },
        spec: invalid(),
      },
    });
    // The same spec is refused by the webhook on create (so the stored one predates the rule).
    const refused = await rejection(create(a, body(`rat-new-${sfx}`, invalid())));
    assert.match(refused.message, /values: must be non-empty when operator is In/);

    // Adding this run's label is an UPDATE the webhook sees (the new object matches its
    // objectSelector); the spec is unchanged, so it is admitted without validation or SAR.
    let mark = cap.lines.length;
    const sars = sarCount();
    await update(users.nobody, name, (o) => {
      o.metadata.labels = { ...o.metadata.labels, [LABEL]: sfx, team: 'blue' };
    });
    await assertNoSar(mark, sars, 'adding labels');
    assert.equal(reviewedSince(mark)[0]!.why, 'spec unchanged (not validated: ratcheting)');
    assert.equal((await read(name)).metadata.labels?.team, 'blue');

    // A change of the spec is still validated.
    const r = await rejection(
      update(users.nobody, name, (o) => {
        (
          o.spec.allowedNamespaces as { selector: { matchExpressions: { key: string }[] } }
        ).selector.matchExpressions[0]!.key = 'other';
      }),
    );
    assert.equal(r.code, 422);

    // Deleting it leaves it Terminating behind the finalizer; removing the finalizer is an
    // UPDATE with the invalid spec unchanged, and the identity goes away.
    await remove(users.nobody, name);
    assert.ok((await read(name)).metadata.deletionTimestamp, 'Terminating');
    mark = cap.lines.length;
    await update(users.nobody, name, (o) => {
      o.metadata.finalizers = [];
    });
    await eventually('the identity to be gone', async () =>
      read(name).then(
        () => false,
        (e) => apiStatus(e) === 404,
      ),
    );
    assert.ok(
      reviewedSince(mark).some(
        (e) => e.operation === 'UPDATE' && e.allowed === true && e.subjectAccessReview === false,
      ),
      'the finalizer removal was reviewed and allowed',
    );
  });
});

/** The text of one `Warning` header (`299 - "text"`, RFC 7234 as the API server writes it). */
function warningText(header: string): string {
  const m = /^\d{3} \S+ "((?:[^"\\]|\\.)*)"/.exec(header);
  return m ? (JSON.parse(`"${m[1]}"`) as string) : header;
}

/**
 * A raw request as the kubeconfig's user, the way kubectl makes it: the status, the body, and
 * every `Warning` response header (one per warning; client-node does not expose them).
 */
async function raw(
  kubeconfigPath: string,
  method: string,
  path: string,
  payload?: unknown,
): Promise<{ status: number; body: Record<string, unknown>; warnings: string[] }> {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const url = new URL(path, kc.getCurrentCluster()!.server);
  const opts: RequestOptions = {
    method,
    hostname: url.hostname,
    port: url.port,
    path: url.pathname + url.search,
    headers: { 'content-type': 'application/json', accept: 'application/json' },
  };
  await kc.applyToHTTPSOptions(opts);
  return new Promise((resolve, reject) => {
    const req = httpsRequest(opts, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const warnings: string[] = [];
        for (let i = 0; i + 1 < res.rawHeaders.length; i += 2)
          if (res.rawHeaders[i]!.toLowerCase() === 'warning') warnings.push(warningText(res.rawHeaders[i + 1]!));
        resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString()), warnings });
      });
    });
    req.on('error', reject);
    req.end(payload === undefined ? undefined : JSON.stringify(payload));
  });
}

describe('warnings before a revocation (SPEC §10)', () => {
  const TIER = 'captf-test/warn-tier';
  let nsA: string, nsB: string, nsC: string;
  let nobody: string;
  const consumers: { namespace: string; plural: string; name: string }[] = [];
  const path = (name: string, dryRun = false) =>
    `/apis/${GROUP}/${VERSION}/${IDENTITY_PLURAL}/${name}${dryRun ? '?dryRun=All' : ''}`;
  /** PUTs the identity with `change` applied, as `user`, through the raw client. */
  const put = async (user: string, name: string, change: (o: Identity) => void, dryRun = false) => {
    const o = await read(name);
    change(o);
    const r = await raw(user, 'PUT', path(name, dryRun), o);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    seen.push(...r.warnings);
    return r;
  };
  const ours = (ws: string[]) => ws.filter((w) => w.startsWith('identity "'));

  before(async () => {
    [nsA, nsB, nsC] = await Promise.all([
      ns.create({ [TIER]: 'gold' }),
      ns.create({ [TIER]: 'gold' }),
      ns.create({ [TIER]: 'silver' }),
    ]);
    nobody = users.nobody.kubeconfigPath;
  });
  after(async () => {
    for (const c of consumers)
      await a.custom.deleteNamespacedCustomObject({ group: GROUP, version: VERSION, ...c }).catch(() => undefined);
  });

  /** An identity of this run and its consumers: `counts` per namespace, half clusters, half machines. */
  async function identityInUse(name: string, allowedNamespaces: unknown, counts: [string, number][]) {
    await createAllowed('the identity', a, body(name, { ...ref(), allowedNamespaces }));
    for (const [namespace, n] of counts) {
      for (let i = 0; i < n; i++) {
        const [plural, kind] =
          i % 2 ? ['terraformmachines', 'TerraformMachine'] : ['terraformclusters', 'TerraformCluster'];
        const c = { namespace, plural, name: `${name}-${i}` };
        await a.custom.createNamespacedCustomObject({
          group: GROUP,
          version: VERSION,
          namespace,
          plural,
          body: { apiVersion: API_VERSION, kind, metadata: { name: c.name }, spec: { identityRef: { name } } },
        });
        consumers.push(c);
      }
    }
  }

  it('a dry-run narrowing previews the warning and changes nothing; the real one returns it too', async () => {
    const name = `w-list-${sfx}`;
    await identityInUse(name, { list: [nsA, nsB, nsC] }, [
      [nsA, 1],
      [nsB, 2],
      [nsC, 1],
    ]);
    const lost = [`${nsB} (2 consumers)`, `${nsC} (1 consumer)`].sort().join(', ');
    const expected = [
      `identity "${name}": spec.allowedNamespaces no longer allows 2 namespaces in use: ${lost}; ` +
        '3 consumers there will lose their credentials',
    ];
    const before = await read(name);
    const sars = sarCount();
    const dry = await put(nobody, name, (o) => void (o.spec.allowedNamespaces = { list: [nsA] }), true);
    assert.deepEqual(ours(dry.warnings), expected);
    const after = await read(name);
    assert.deepEqual(after.spec.allowedNamespaces, { list: [nsA, nsB, nsC] }, 'a dry run changes nothing');
    assert.equal(after.metadata.resourceVersion, before.metadata.resourceVersion);

    const real = await put(nobody, name, (o) => void (o.spec.allowedNamespaces = { list: [nsA] }));
    assert.deepEqual(ours(real.warnings), expected);
    assert.deepEqual((await read(name)).spec.allowedNamespaces, { list: [nsA] });
    assert.equal(sarCount(), sars, 'a narrowing needs no SubjectAccessReview');
  });

  it('a tightened selector: the webhook reads namespace labels (get namespaces) and names who loses access', async () => {
    const name = `w-sel-${sfx}`;
    await identityInUse(name, { selector: { matchExpressions: [{ key: TIER, operator: 'Exists' }] } }, [
      [nsA, 1],
      [nsC, 3],
    ]);
    // The selector only gains a requirement: narrowing, no SubjectAccessReview.
    const r = await put(
      nobody,
      name,
      (o) =>
        void (o.spec.allowedNamespaces = {
          selector: { matchLabels: { [TIER]: 'gold' }, matchExpressions: [{ key: TIER, operator: 'Exists' }] },
        }),
    );
    assert.deepEqual(ours(r.warnings), [
      `identity "${name}": spec.allowedNamespaces no longer allows 1 namespace in use: ${nsC} (3 consumers); ` +
        `3 consumers there will lose their credentials`,
    ]);
  });

  it('no warning when nobody loses access; a widening that passes the SAR is warned about what it drops', async () => {
    const name = `w-none-${sfx}`;
    await identityInUse(name, { list: [nsA, nsB] }, [[nsA, 1]]);
    const none = await put(nobody, name, (o) => void (o.spec.allowedNamespaces = { list: [nsA] }));
    assert.deepEqual(ours(none.warnings), []);
    const direct = users.direct.kubeconfigPath;
    const swap = await put(direct, name, (o) => void (o.spec.allowedNamespaces = { list: [nsC] }));
    assert.deepEqual(ours(swap.warnings), [
      `identity "${name}": spec.allowedNamespaces no longer allows 1 namespace in use: ${nsA} (1 consumer); ` +
        `1 consumer there will lose its credentials`,
    ]);
  });

  it('a secretRef change that passes the SAR warns that every mirror will be rewritten from the new Secret', async () => {
    const name = `w-ref-${sfx}`;
    await identityInUse(name, { list: [nsA] }, [[nsA, 1]]);
    const direct = users.direct.kubeconfigPath;
    const r = await put(direct, name, (o) => void (o.spec.secretRef = { name: 'other-creds', namespace: secretsNs }));
    assert.deepEqual(ours(r.warnings), [
      `identity "${name}": spec.secretRef changed; every mirror will be rewritten from ${secretsNs}/other-creds`,
    ]);
  });

  it('kubectl prints the warnings as Warning: lines, and --dry-run=server is a preview', async (t) => {
    const kubectl = builtKubectlPath();
    if (!kubectl) {
      t.skip('kubectl is not built (npm run tools -- kubectl)');
      return;
    }
    const name = `w-kubectl-${sfx}`;
    await identityInUse(name, { list: [nsA, nsB] }, [[nsB, 2]]);
    const patch = JSON.stringify({ spec: { allowedNamespaces: { list: [nsA] } } });
    const args = ['--kubeconfig', nobody, 'patch', `${IDENTITY_PLURAL}.${GROUP}`, name, '--type', 'merge', '-p', patch];
    // Not spawnSync: the webhook runs in this process and must keep answering meanwhile.
    const out = await promisify(execFile)(kubectl, [...args, '--dry-run=server'], { encoding: 'utf8' });
    t.diagnostic(`kubectl said:\n${out.stderr}${out.stdout}`);
    assert.match(out.stdout, new RegExp(`${name} patched`));
    assert.ok(
      out.stderr.includes(
        `Warning: identity "${name}": spec.allowedNamespaces no longer allows 1 namespace in use: ${nsB} (2 consumers); ` +
          `2 consumers there will lose their credentials\n`,
      ),
      out.stderr,
    );
    assert.deepEqual((await read(name)).spec.allowedNamespaces, { list: [nsA, nsB] });
  });
});

describe('no Secret data anywhere', () => {
  it('no planted value in any message a user saw or any log line of the function', () => {
    assert.ok(seen.length > 10, 'messages were collected');
    assertNoSecret(seen.join('\n'), secretValues, 'API error messages');
    assertNoSecret(cap.lines.join('\n'), secretValues, 'admission logs');
  });
});
