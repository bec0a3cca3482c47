/**
 * The admission matrix through the real API server: the function runs in-process over HTTPS
 * as its ServiceAccount (helpers/admission.ts), a ValidatingWebhookConfiguration points the
 * API server at it, and every request is made by a client-certificate user with real RBAC.
 * The webhook only sees identities labeled with this file's label, so other test files'
 * identities are never affected.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { before, describe, it } from 'node:test';
import type { V1PolicyRule } from '@kubernetes/client-node';
import {
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  TERRAFORM_MACHINE,
  type LabelSelectorRequirement,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import type { Clients } from '../../functions/lib/kube.ts';
import { identities } from '../../functions/lib/objects.ts';
import { builtKubectlPath } from '../../scripts/tools/build.ts';
import {
  admissionWebhook,
  grant,
  identityPath,
  refusal,
  request,
  storedIdentity,
  type Webhook,
} from '../helpers/admission.ts';
import { asUser, controlPlaneDir, eventually, suffix } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, sentinel } from '../helpers/logs.ts';

type Identity = TerraformClusterIdentity;
type User = Clients & { kubeconfigPath: string };

const w = fx.world('adm');
const a = w.clients;
const sfx = suffix();
const secretValues = [sentinel(), sentinel(), sentinel()];
/** Every message a user saw, scanned for planted Secret values at the end. */
const seen: string[] = [];

const editors = w.name('editors');
const readers = w.name('readers');

let hook: Webhook;
let secretsNs: string;
let otherSecretsNs: string;
let consumerNs: string;
const users: Record<'direct' | 'member' | 'scoped' | 'nobody' | 'lister', User> = {} as never;

/** An identity of this file (sent to the webhook) on `secretsNs/creds`, unless modifiers say otherwise. */
const ours = (name: string, ...mods: fx.Modifier<Identity>[]) =>
  fx.identity(name, hook.ours, fx.secretRef(secretsNs, 'creds'), ...mods);
const create = (c: Clients, o: Identity) => identities(c).create(o);
const read = (name: string) => storedIdentity(w, name);
/** Read-modify-write as `c` (an UPDATE through the webhook). */
const update = async (c: Clients, name: string, change: (o: Identity) => void) => {
  const objects = identities(c);
  const o = await objects.get({ name });
  change(o);
  return objects.replace(o);
};
const remove = (c: Clients, name: string) => identities(c).delete({ name });
/** A raw request as `user`; its message is kept for the scan at the end. */
const raw = async (user: User, method: string, path: string, body: unknown) => {
  const r = await request(user.kubeconfigPath, method, path, { body });
  seen.push(r.message);
  return r;
};

/** {@link refusal}, its message kept for the scan at the end. */
async function rejection(p: Promise<unknown>): Promise<{ code: number | undefined; message: string }> {
  const r = await refusal(p);
  seen.push(r.message);
  return r;
}

/** Number of SubjectAccessReviews the function's own user has made (from the audit log). */
function sarCount(): number {
  const user = hook.account.user;
  const log = readFileSync(join(controlPlaneDir(), 'logs', 'audit.log'), 'utf8');
  let n = 0;
  for (const line of log.split('\n')) {
    if (!line.includes(user) || !line.includes('subjectaccessreviews')) continue;
    const e = JSON.parse(line) as { stage?: string; user?: { username?: string }; objectRef?: { resource?: string } };
    if (e.stage === 'ResponseComplete' && e.user?.username === user && e.objectRef?.resource === 'subjectaccessreviews')
      n++;
  }
  return n;
}

/** The function's "reviewed" log entries since `mark` lines. */
const reviewedSince = (mark: number) =>
  hook.log
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

before(async () => {
  [secretsNs, otherSecretsNs, consumerNs] = await Promise.all([w.namespace(), w.namespace(), w.namespace()]);
  for (const [n, name, v] of [
    [secretsNs, 'creds', 0],
    [secretsNs, 'other-creds', 1],
    [otherSecretsNs, 'creds', 2],
  ] as const) {
    await w.create(fx.sourceSecret(name, fx.inNamespace(n), fx.data({ token: secretValues[v]! })));
  }
  hook = await admissionWebhook(w, 'captf-test/admission');

  // Every test user may create/update/delete identities and their status; Secret access varies.
  const { group, plural } = IDENTITY_RESOURCE;
  const getSecrets: V1PolicyRule = { apiGroups: [''], resources: ['secrets'], verbs: ['get'] };
  const [direct, scoped, lister] = [`direct-${sfx}`, `scoped-${sfx}`, `lister-${sfx}`];
  await Promise.all([
    grant(w, { kind: 'Group', name: editors }, [
      { apiGroups: [group], resources: [plural], verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'] },
      { apiGroups: [group], resources: [`${plural}/status`], verbs: ['get', 'update', 'patch'] },
    ]),
    grant(w, { kind: 'User', name: direct }, [getSecrets], secretsNs),
    grant(w, { kind: 'Group', name: readers }, [getSecrets], secretsNs),
    grant(w, { kind: 'User', name: scoped }, [{ ...getSecrets, resourceNames: ['creds'] }], secretsNs),
    grant(w, { kind: 'User', name: lister }, [{ ...getSecrets, verbs: ['list'] }], secretsNs),
  ]);
  [users.direct, users.member, users.scoped, users.nobody, users.lister] = await Promise.all([
    asUser(direct, [editors]),
    asUser(`member-${sfx}`, [editors, readers]),
    asUser(scoped, [editors]),
    asUser(`nobody-${sfx}`, [editors]),
    asUser(lister, [editors]),
  ]);
});

/** Creates as `c`, retrying while RBAC or the webhook are still settling (allowed cases only). */
const createAllowed = (what: string, c: Clients, o: Identity) =>
  eventually(what, async () => Boolean(await create(c, o)), 30_000);

describe('admission on CREATE: a SubjectAccessReview for get on the named Secret', () => {
  it('allowed by direct RBAC (a RoleBinding to the user), and the SAR is visible in the audit log', async () => {
    const before = sarCount();
    await createAllowed('direct create', users.direct, ours(w.name('c-direct'), fx.allowList('a')));
    await eventually('the SubjectAccessReview in the audit log', async () => sarCount() > before, 10_000);
  });

  it('allowed only through a group', async () => {
    await createAllowed('group create', users.member, ours(w.name('c-group')));
  });

  it('allowed through a Role scoped by resourceNames, for that Secret only', async () => {
    await createAllowed('scoped create', users.scoped, ours(w.name('c-scoped')));
    const other = ours(w.name('c-scoped-other'), fx.secretRef(secretsNs, 'other-creds'));
    const r = await rejection(create(users.scoped, other));
    assert.match(r.message, new RegExp(`user "scoped-${sfx}" may not get Secret ${secretsNs}/other-creds`));
  });

  it('denied without RBAC, naming user, verb, Secret and rule', async () => {
    const r = await rejection(create(users.nobody, ours(w.name('c-nobody'))));
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
    const r = await rejection(create(users.lister, ours(w.name('c-lister'))));
    assert.match(r.message, new RegExp(`user "lister-${sfx}" may not get Secret ${secretsNs}/creds`));
  });

  it('a dry-run create is reviewed the same way (denied without RBAC; allowed with it, and nothing stored)', async () => {
    const dry = ours(w.name('c-dry'));
    const dryRun = (user: User) => raw(user, 'POST', identityPath(undefined, '?dryRun=All'), dry);
    let mark = hook.log.lines.length;
    const r = await dryRun(users.nobody);
    assert.match(r.message, new RegExp(`user "nobody-${sfx}" may not get Secret ${secretsNs}/creds`));
    await eventually(
      'the denied dry run in the function log',
      async () =>
        reviewedSince(mark).some((e) => e.dryRun === true && e.subjectAccessReview === true && e.allowed === false),
      5_000,
    );
    mark = hook.log.lines.length;
    await eventually('dry-run create', async () => (await dryRun(users.direct)).status === 201, 30_000);
    await eventually(
      'the allowed dry run in the function log',
      async () =>
        reviewedSince(mark).some((e) => e.dryRun === true && e.subjectAccessReview === true && e.allowed === true),
      5_000,
    );
    assert.equal(await w.read(dry), undefined, 'a dry run stores nothing');
  });
});

describe('admission on UPDATE: a SAR only when secretRef changes or allowedNamespaces widens', () => {
  const name = w.name('u');
  const base = () =>
    ours(
      name,
      fx.allowedNamespaces({
        list: ['a', 'b'],
        selector: {
          matchLabels: { env: 'prod' },
          matchExpressions: [{ key: 'tier', operator: 'In', values: ['x', 'y'] }],
        },
      }),
    );
  const reset = () => w.put(base());
  before(async () => {
    await createAllowed('the identity to update', a, base());
  });

  const denied: [string, (o: Identity) => void, RegExp][] = [
    [
      'secretRef.name changed',
      (o) => void (o.spec.secretRef = { name: 'other-creds', namespace: secretsNs }),
      /changing spec\.secretRef/,
    ],
    [
      'secretRef.namespace changed',
      (o) => void (o.spec.secretRef = { name: 'creds', namespace: otherSecretsNs }),
      /changing spec\.secretRef/,
    ],
    [
      'list gains a name',
      (o) => void o.spec.allowedNamespaces!.list!.push('c'),
      /widening spec\.allowedNamespaces \(list gains c\)/,
    ],
    ['selector loses a requirement', (o) => void delete o.spec.allowedNamespaces!.selector!.matchLabels, /widening/],
    ['selector value changed', (o) => void (o.spec.allowedNamespaces!.selector!.matchLabels!.env = 'dev'), /widening/],
    [
      'list → selector',
      (o) => void (o.spec.allowedNamespaces = { selector: { matchLabels: { env: 'prod' } } }),
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
    const change = (o: Identity) => void (o.spec.secretRef = { name: 'other-creds', namespace: secretsNs });
    await eventually('update by direct', async () => Boolean(await update(users.direct, name, change)), 30_000);
    assert.equal((await read(name)).spec.secretRef.name, 'other-creds');
  });

  it('secretRef.namespace changed: denied even for a user who may get the old Secret', async () => {
    await reset();
    const change = (o: Identity) => void (o.spec.secretRef = { name: 'creds', namespace: otherSecretsNs });
    const r = await rejection(update(users.direct, name, change));
    assert.match(r.message, new RegExp(`may not get Secret ${otherSecretsNs}/creds`));
  });

  const allowed: [string, (o: Identity) => void][] = [
    ['list loses a name', (o) => void (o.spec.allowedNamespaces!.list = ['a'])],
    [
      'selector unchanged (requirements and values reordered)',
      (o) => void (o.spec.allowedNamespaces!.selector!.matchExpressions![0]!.values = ['y', 'x']),
    ],
    ['selector gains a requirement', (o) => void (o.spec.allowedNamespaces!.selector!.matchLabels!.team = 'blue')],
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
      const mark = hook.log.lines.length;
      const sars = sarCount();
      await update(users.nobody, name, change);
      await assertNoSar(mark, sars, what);
    });
  }

  it('unset → selector: {} is widening: denied without Secret access, allowed with it', async () => {
    await update(a, name, (o) => void delete o.spec.allowedNamespaces);
    const everyNamespace = (o: Identity) => void (o.spec.allowedNamespaces = { selector: {} });
    const r = await rejection(update(users.nobody, name, everyNamespace));
    assert.match(r.message, /widening spec\.allowedNamespaces \(a selector was added\)/);
    await update(users.member, name, everyNamespace);
    assert.deepEqual((await read(name)).spec.allowedNamespaces, { selector: {} });
  });

  it('a status update is never reviewed', async () => {
    const mark = hook.log.lines.length;
    const sars = sarCount();
    const o = await identities(users.nobody).get({ name });
    const r = await raw(users.nobody, 'PUT', identityPath(name, '/status'), {
      ...o,
      status: { namespaces: ['x-status'] },
    });
    assert.equal(r.status, 200, r.message);
    await new Promise((res) => setTimeout(res, 500));
    assert.equal(reviewedSince(mark).length, 0, 'the webhook was not called');
    assert.equal(sarCount(), sars);
    await identities(a).applyStatus({ metadata: { name }, status: { namespaces: [] } });
  });
});

describe('admission rejects invalid forms', () => {
  it('allowedNamespaces: {} is rejected by the CRD CEL rule before the webhook', async () => {
    const mark = hook.log.lines.length;
    const r = await rejection(create(a, ours(w.name('r-empty'), fx.allowedNamespaces({}))));
    assert.equal(r.code, 422);
    assert.match(r.message, /allowedNamespaces: \{\} is ambiguous/);
    await new Promise((res) => setTimeout(res, 500));
    assert.equal(reviewedSince(mark).length, 0, 'the webhook was not called');
  });

  const operators: [string, LabelSelectorRequirement, RegExp][] = [
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
  ];
  for (const [what, expr, msg] of operators) {
    it(`a selector with ${what} is rejected by the webhook, naming the bad part`, async () => {
      const r = await rejection(create(a, ours(w.name('r-op'), fx.allowSelector({ matchExpressions: [expr] }))));
      assert.equal(r.code, 422);
      assert.match(r.message, msg);
    });
  }

  it('an invalid Secret name is rejected by the webhook', async () => {
    const r = await rejection(create(a, ours(w.name('r-name'), fx.secretRef(secretsNs, 'Not_Valid'))));
    assert.match(r.message, /spec\.secretRef\.name: "Not_Valid" is not a valid Secret name/);
  });
});

describe('admission on DELETE: refused while the identity is in use', () => {
  /** Sets `status.namespaces` as the admin, through the status subresource. */
  const inUseIn = (name: string, namespaces: string[]) =>
    identities(a).applyStatus({ metadata: { name }, status: { namespaces } });

  it('refused while status.namespaces is non-empty (set by the admin through the status subresource)', async () => {
    const name = w.name('d-status');
    await createAllowed('identity', a, ours(name));
    await inUseIn(name, ['team-b', 'team-a']);
    const r = await rejection(remove(users.nobody, name));
    assert.match(
      r.message,
      new RegExp(
        `user "nobody-${sfx}" may not delete TerraformClusterIdentity "${name}": it is in use in 2 namespaces: team-a, team-b \\(see its status.namespaces\\)`,
      ),
    );
    await inUseIn(name, []);
    await remove(users.nobody, name);
  });

  it('in use in 300 namespaces with the longest names, the refusal still fits in 1 KiB (SPEC §10)', async () => {
    const name = w.name('d-many');
    await createAllowed('identity', a, ours(name));
    const namespaces = Array.from({ length: 300 }, (_, i) => `${String(i).padStart(3, '0')}-${'n'.repeat(59)}`);
    await inUseIn(name, namespaces);
    const r = await rejection(remove(users.nobody, name));
    const denial = r.message.slice(r.message.indexOf(`user "nobody-${sfx}"`));
    assert.ok(Buffer.byteLength(denial) < 1024, `${Buffer.byteLength(denial)} bytes: ${denial}`);
    assert.match(denial, /in use in 300 namespaces: 000-n+, 001-n+, .*, and 290 more \(see its status\.namespaces\)/);
    assert.doesNotMatch(denial, /010-n/, 'the eleventh is not listed');
    await inUseIn(name, []);
    await remove(users.nobody, name);
  });

  it('refused with an empty status while a live consumer references it; allowed once it is gone', async () => {
    const name = w.name('d-live');
    await createAllowed('identity', a, ours(name));
    const user = await w.create(fx.consumer('user', fx.inNamespace(consumerNs), fx.identityRef(name)));
    assert.deepEqual((await read(name)).status ?? {}, {}, 'status is empty');
    const r = await rejection(remove(users.nobody, name));
    assert.match(r.message, new RegExp(`in use in 1 namespace: ${consumerNs} \\(see its status.namespaces\\);`));
    await w.delete(user);
    await eventually(
      'delete once unused',
      async () => {
        await remove(users.nobody, name);
        return true;
      },
      30_000,
    );
  });

  it('allowed when unused', async () => {
    const name = w.name('d-unused');
    await createAllowed('identity', a, ours(name));
    await remove(users.nobody, name);
    assert.equal(await w.read(fx.identity(name)), undefined);
  });
});

describe('ratcheting: an UPDATE that leaves spec unchanged is admitted without validation', () => {
  // `operator: In` without values passes the CRD schema (and its CEL rule, which only refuses
  // `{}`) but not the webhook. Created without this file's label, the webhook's objectSelector
  // does not match, so the API server stores it as if the webhook had been down.
  const name = w.name('rat');
  const invalid = () => fx.allowSelector({ matchExpressions: [{ key: 'tier', operator: 'In' }] });

  it('an identity stored with a spec the webhook rejects gets a label, is deleted, and loses its finalizer', async () => {
    await w.create(fx.identity(name, fx.secretRef(secretsNs, 'creds'), invalid(), fx.finalizers('test.captf.io/hold')));
    w.onCleanup(() => update(a, name, (o) => void (o.metadata.finalizers = [])));
    // The same spec is refused by the webhook on create (so the stored one predates the rule).
    const refused = await rejection(create(a, ours(w.name('rat-new'), invalid())));
    assert.match(refused.message, /values: must be non-empty when operator is In/);

    // Adding this file's label is an UPDATE the webhook sees (the new object matches its
    // objectSelector); the spec is unchanged, so it is admitted without validation or SAR.
    let mark = hook.log.lines.length;
    const sars = sarCount();
    await update(users.nobody, name, (o) => {
      hook.ours(o);
      fx.labels({ team: 'blue' })(o);
    });
    await assertNoSar(mark, sars, 'adding labels');
    assert.equal(reviewedSince(mark)[0]!.why, 'spec unchanged (not validated: ratcheting)');
    assert.equal((await read(name)).metadata.labels?.team, 'blue');

    // A change of the spec is still validated.
    const r = await rejection(
      update(users.nobody, name, (o) => void (o.spec.allowedNamespaces!.selector!.matchExpressions![0]!.key = 'other')),
    );
    assert.equal(r.code, 422);

    // Deleting it leaves it Terminating behind the finalizer; removing the finalizer is an
    // UPDATE with the invalid spec unchanged, and the identity goes away.
    await remove(users.nobody, name);
    assert.ok((await read(name)).metadata.deletionTimestamp, 'Terminating');
    mark = hook.log.lines.length;
    await update(users.nobody, name, (o) => void (o.metadata.finalizers = []));
    await eventually('the identity to be gone', async () => (await w.read(fx.identity(name))) === undefined);
    assert.ok(
      reviewedSince(mark).some(
        (e) => e.operation === 'UPDATE' && e.allowed === true && e.subjectAccessReview === false,
      ),
      'the finalizer removal was reviewed and allowed',
    );
  });
});

describe('warnings before a revocation (SPEC §10)', () => {
  const TIER = 'captf-test/warn-tier';
  let nsA: string, nsB: string, nsC: string;
  /** PUTs the identity with `change` applied, as `user`, through the raw client (which shows the warnings). */
  const put = async (user: User, name: string, change: (o: Identity) => void, dryRun = false) => {
    const o = await read(name);
    change(o);
    const r = await raw(user, 'PUT', identityPath(name, dryRun ? '?dryRun=All' : ''), o);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    seen.push(...r.warnings);
    return r;
  };
  const identityWarnings = (ws: string[]) => ws.filter((x) => x.startsWith('identity "'));
  const narrowTo =
    (...list: string[]) =>
    (o: Identity) =>
      void (o.spec.allowedNamespaces = { list });

  before(async () => {
    [nsA, nsB, nsC] = await Promise.all([
      w.namespace(fx.labels({ [TIER]: 'gold' })),
      w.namespace(fx.labels({ [TIER]: 'gold' })),
      w.namespace(fx.labels({ [TIER]: 'silver' })),
    ]);
  });

  /** An identity of this file and its consumers: `counts` per namespace, half clusters, half machines. */
  async function identityInUse(name: string, allowed: fx.Modifier<Identity>, counts: [string, number][]) {
    await createAllowed('the identity', a, ours(name, allowed));
    for (const [namespace, n] of counts) {
      for (let i = 0; i < n; i++) {
        const kind = fx.ofKind(i % 2 ? TERRAFORM_MACHINE : TERRAFORM_CLUSTER);
        await w.create(fx.consumer(`${name}-${i}`, fx.inNamespace(namespace), fx.identityRef(name), kind));
      }
    }
  }

  it('a dry-run narrowing previews the warning and changes nothing; the real one returns it too', async () => {
    const name = w.name('w-list');
    await identityInUse(name, fx.allowList(nsA, nsB, nsC), [
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
    const dry = await put(users.nobody, name, narrowTo(nsA), true);
    assert.deepEqual(identityWarnings(dry.warnings), expected);
    const after = await read(name);
    assert.deepEqual(after.spec.allowedNamespaces, { list: [nsA, nsB, nsC] }, 'a dry run changes nothing');
    assert.equal(after.metadata.resourceVersion, before.metadata.resourceVersion);

    const real = await put(users.nobody, name, narrowTo(nsA));
    assert.deepEqual(identityWarnings(real.warnings), expected);
    assert.deepEqual((await read(name)).spec.allowedNamespaces, { list: [nsA] });
    assert.equal(sarCount(), sars, 'a narrowing needs no SubjectAccessReview');
  });

  it('a tightened selector: the webhook reads namespace labels (get namespaces) and names who loses access', async () => {
    const name = w.name('w-sel');
    const exists = { key: TIER, operator: 'Exists' };
    await identityInUse(name, fx.allowSelector({ matchExpressions: [exists] }), [
      [nsA, 1],
      [nsC, 3],
    ]);
    // The selector only gains a requirement: narrowing, no SubjectAccessReview.
    const tightened = { selector: { matchLabels: { [TIER]: 'gold' }, matchExpressions: [exists] } };
    const r = await put(users.nobody, name, (o) => void (o.spec.allowedNamespaces = tightened));
    assert.deepEqual(identityWarnings(r.warnings), [
      `identity "${name}": spec.allowedNamespaces no longer allows 1 namespace in use: ${nsC} (3 consumers); ` +
        `3 consumers there will lose their credentials`,
    ]);
  });

  it('no warning when nobody loses access; a widening that passes the SAR is warned about what it drops', async () => {
    const name = w.name('w-none');
    await identityInUse(name, fx.allowList(nsA, nsB), [[nsA, 1]]);
    const none = await put(users.nobody, name, narrowTo(nsA));
    assert.deepEqual(identityWarnings(none.warnings), []);
    const swap = await put(users.direct, name, narrowTo(nsC));
    assert.deepEqual(identityWarnings(swap.warnings), [
      `identity "${name}": spec.allowedNamespaces no longer allows 1 namespace in use: ${nsA} (1 consumer); ` +
        `1 consumer there will lose its credentials`,
    ]);
  });

  it('a secretRef change that passes the SAR warns that every mirror will be rewritten from the new Secret', async () => {
    const name = w.name('w-ref');
    await identityInUse(name, fx.allowList(nsA), [[nsA, 1]]);
    const change = (o: Identity) => void (o.spec.secretRef = { name: 'other-creds', namespace: secretsNs });
    const r = await put(users.direct, name, change);
    assert.deepEqual(identityWarnings(r.warnings), [
      `identity "${name}": spec.secretRef changed; every mirror will be rewritten from ${secretsNs}/other-creds`,
    ]);
  });

  const kubectl = builtKubectlPath();
  const skip = kubectl ? false : 'kubectl is not built (npm run tools -- kubectl)';
  it('kubectl prints the warnings as Warning: lines, and --dry-run=server is a preview', { skip }, async (t) => {
    const name = w.name('w-kubectl');
    await identityInUse(name, fx.allowList(nsA, nsB), [[nsB, 2]]);
    const patch = JSON.stringify({ spec: { allowedNamespaces: { list: [nsA] } } });
    const resource = `${IDENTITY_RESOURCE.plural}.${IDENTITY_RESOURCE.group}`;
    const args = ['--kubeconfig', users.nobody.kubeconfigPath, 'patch', resource, name, '--type', 'merge', '-p', patch];
    // Not spawnSync: the webhook runs in this process and must keep answering meanwhile.
    const out = await promisify(execFile)(kubectl!, [...args, '--dry-run=server'], { encoding: 'utf8' });
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
    assertNoSecret(hook.log.lines.join('\n'), secretValues, 'admission logs');
  });
});
