/**
 * Privilege: every way we found for a user who may NOT get the operator's
 * source Secret to still obtain an identity pointing at it, or to widen an identity that does
 * to a new namespace, tried through the real API server with the real webhook registered —
 * one table, one row per attempt, each denied (or, for the status subresource, accepted with
 * the spec left as it was). One more row documents the one way that is allowed by design:
 * whoever may label namespaces can label one into a selector identity's set (SPEC §2;
 * docs/deploy-knative.md, "Selector identities trust namespace labels").
 *
 * Set-up as in admission.test.ts (helpers/admission.ts): the function runs in-process over
 * HTTPS as its ServiceAccount, a ValidatingWebhookConfiguration points the API server at it
 * with an objectSelector on this file's label (so other files' identities are not sent to
 * it), and every attempt is a raw request made with the attacker's client certificate.
 */
import assert from 'node:assert/strict';
import { isDeepStrictEqual } from 'node:util';
import { before, describe, it } from 'node:test';
import { isNamespaceAllowed } from '../../functions/lib/allowed-namespaces.ts';
import { IDENTITY_RESOURCE, type TerraformClusterIdentity } from '../../functions/lib/api.ts';
import {
  admissionWebhook,
  grant,
  identityPath,
  request,
  storedIdentity,
  type ApiAnswer,
  type Webhook,
} from '../helpers/admission.ts';
import { asUser, eventually, suffix } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, sentinel } from '../helpers/logs.ts';

const w = fx.world('priv');
const TIER = `captf-test/tier-${suffix()}`;
const planted = [sentinel(), sentinel(), sentinel()];
const seen: string[] = [];
const MERGE = 'application/merge-patch+json';
const getSecrets = { apiGroups: [''], resources: ['secrets'], verbs: ['get'] };

const malloryName = w.name('mallory');
const readerName = w.name('reader');
/** The identity mallory makes on her own Secret, and then tries to point at the operator's. */
const malOwn = w.name('mal-own');

let hook: Webhook;
let secretsNs: string; // the operator's Secrets: creds, other-creds
let malloryNs: string; // a namespace where mallory may get Secrets: her own creds
let tenantA: string;
let tenantB: string;
let mallory: string; // kubeconfig paths
let labeller: string;

/** A raw request as `user` (a kubeconfig path); every answer is kept for the scan at the end. */
async function api(user: string, method: string, path: string, opts: Parameters<typeof request>[3] = {}) {
  const r = await request(user, method, path, opts);
  seen.push(r.message);
  return r;
}

/** An identity of this file (sent to the webhook). */
const ours = (name: string, ...mods: fx.Modifier<TerraformClusterIdentity>[]) => fx.identity(name, hook.ours, ...mods);
const read = (name: string) => storedIdentity(w, name);
const exists = async (name: string) => (await w.read(fx.identity(name))) !== undefined;

/** The identities the operator made, which the attacker tries to point or widen. */
const OPERATOR = {
  list: w.name('op-list'),
  selector: w.name('op-sel'),
  mixed: w.name('op-mixed'),
  forced: w.name('op-forced'),
};

before(async () => {
  [secretsNs, malloryNs, tenantA, tenantB] = await Promise.all([
    w.namespace(),
    w.namespace(),
    w.namespace(),
    w.namespace(),
  ]);
  for (const [namespace, name, value] of [
    [secretsNs, 'creds', planted[0]!],
    [secretsNs, 'other-creds', planted[1]!],
    [malloryNs, 'creds', planted[2]!],
  ] as const) {
    await w.create(fx.sourceSecret(name, fx.inNamespace(namespace), fx.data({ token: value })));
  }
  hook = await admissionWebhook(w, 'captf-test/privilege');

  // mallory may do anything to identities and their status, and get Secrets in her own namespace only.
  const mallorySubject = { kind: 'User', name: malloryName } as const;
  const { group, plural } = IDENTITY_RESOURCE;
  const anything = ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'];
  await grant(w, mallorySubject, [{ apiGroups: [group], resources: [plural, `${plural}/status`], verbs: anything }]);
  await grant(w, mallorySubject, [getSecrets], malloryNs);
  // A user who may read the operator's Secret (whom mallory would like to be).
  await grant(w, { kind: 'User', name: readerName }, [getSecrets], secretsNs);
  // Whoever may label namespaces (the security notes: cluster admins, or whoever is granted this).
  const labellerName = w.name('labeller');
  const labelNamespaces = { apiGroups: [''], resources: ['namespaces'], verbs: ['get', 'patch'] };
  await grant(w, { kind: 'User', name: labellerName }, [labelNamespaces]);
  [mallory, labeller] = await Promise.all([
    asUser(malloryName).then((u) => u.kubeconfigPath),
    asUser(labellerName).then((u) => u.kubeconfigPath),
  ]);

  // Created by the admin.
  const creds = fx.secretRef(secretsNs, 'creds');
  const inTier = { matchExpressions: [{ key: TIER, operator: 'In', values: ['gold'] }] };
  await w.create(ours(OPERATOR.list, creds, fx.allowList(tenantA)));
  await w.create(ours(OPERATOR.selector, creds, fx.allowSelector(inTier)));
  await w.create(
    ours(
      OPERATOR.mixed,
      creds,
      fx.allowedNamespaces({ list: [tenantA], selector: { matchLabels: { [TIER]: 'gold' } } }),
    ),
  );
  await w.create(ours(OPERATOR.forced, creds, fx.allowList(tenantA)));
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

/** mallory's PATCH of `name`, which the webhook must deny for want of `secret`, leaving it unchanged. */
const patchDenied = (name: string, body: unknown, contentType = MERGE, secret?: string) =>
  unchanged(name, async () =>
    deniedForSecret(await api(mallory, 'PATCH', identityPath(name), { contentType, body }), secret),
  );

/** mallory's POST of `o`, which the webhook must deny, storing nothing. */
async function createDenied(o: TerraformClusterIdentity, tail = ''): Promise<Outcome> {
  const r = await api(mallory, 'POST', identityPath(undefined, tail), { body: o });
  assert.equal(await exists(o.metadata.name!), false);
  return deniedForSecret(r);
}

const wider = (o: TerraformClusterIdentity) => ({
  ...o,
  spec: { ...o.spec, allowedNamespaces: { list: [tenantA, tenantB] } },
});

/** One attempt: a name, and the attempt itself, which asserts its outcome and describes it. */
interface Attempt {
  what: string;
  attempt: () => Promise<Outcome>;
}

const ATTEMPTS: Attempt[] = [
  {
    what: 'a second identity on the same Secret (CREATE)',
    attempt: () => createDenied(ours(w.name('mal-second'), fx.secretRef(secretsNs, 'creds'), fx.allowList(tenantB))),
  },
  {
    what: 'the same CREATE as a dry run (dryRun=All)',
    attempt: () => createDenied(ours(w.name('mal-dry'), fx.secretRef(secretsNs, 'creds')), '?dryRun=All'),
  },
  {
    what: 'a non-canonical reference to the Secret (upper case, trailing dot)',
    attempt: async () => {
      const outcomes: string[] = [];
      for (const [namespace, name] of [
        [secretsNs, 'CREDS'],
        [secretsNs, 'creds.'],
        [`${secretsNs}.`, 'creds'],
      ] as const) {
        const body = ours(w.name('mal-odd'), fx.secretRef(namespace, name));
        const r = await api(mallory, 'POST', identityPath(), { body });
        assert.ok(r.status === 422 || r.status === 403, `${namespace}/${name}: ${r.status} ${r.message}`);
        outcomes.push(String(r.status));
      }
      return `refused (${outcomes.join(', ')}): invalid names`;
    },
  },
  {
    what: 'two steps: an identity on her own Secret (allowed), then secretRef pointed at the operator’s',
    attempt: async () => {
      const name = malOwn;
      const body = ours(name, fx.secretRef(malloryNs, 'creds'), fx.allowList(tenantB));
      const created = await api(mallory, 'POST', identityPath(), { body });
      assert.equal(created.status, 201, `step 1 (her own Secret) is allowed: ${created.message}`);
      const otherCreds = { spec: { secretRef: { name: 'other-creds', namespace: secretsNs } } };
      return patchDenied(name, otherCreds, MERGE, `${secretsNs}/other-creds`);
    },
  },
  {
    what: 'changing only secretRef.namespace (creds in her namespace → creds in the operator’s)',
    attempt: () => patchDenied(malOwn, { spec: { secretRef: { namespace: secretsNs } } }),
  },
  {
    what: 'two steps: drop the selector (a narrowing, allowed), then put it back',
    attempt: async () => {
      const name = OPERATOR.mixed;
      const dropped = await api(mallory, 'PATCH', identityPath(name), {
        contentType: MERGE,
        body: { spec: { allowedNamespaces: { selector: null } } },
      });
      assert.equal(dropped.status, 200, `step 1 (narrowing) is allowed: ${dropped.message}`);
      return patchDenied(name, { spec: { allowedNamespaces: { selector: { matchLabels: { [TIER]: 'gold' } } } } });
    },
  },
  {
    what: 'list → selector (merge patch)',
    attempt: () =>
      patchDenied(OPERATOR.list, {
        spec: { allowedNamespaces: { list: null, selector: { matchLabels: { [TIER]: 'gold' } } } },
      }),
  },
  {
    what: 'matchExpressions that match more: In (gold) → In (gold, silver)',
    attempt: () =>
      patchDenied(OPERATOR.selector, {
        spec: {
          allowedNamespaces: {
            selector: { matchExpressions: [{ key: TIER, operator: 'In', values: ['gold', 'silver'] }] },
          },
        },
      }),
  },
  {
    what: 'matchExpressions that match more: In (gold) → Exists, and → NotIn (bronze)',
    attempt: async () => {
      const outcomes: string[] = [];
      for (const expr of [
        { key: TIER, operator: 'Exists' },
        { key: TIER, operator: 'NotIn', values: ['bronze'] },
      ]) {
        const selector = { matchExpressions: [expr] };
        outcomes.push(
          (await patchDenied(OPERATOR.selector, { spec: { allowedNamespaces: { selector } } })).slice(0, 3),
        );
      }
      return outcomes.join(', ');
    },
  },
  {
    what: 'server-side apply of a wider list (fieldManager=mallory, force=true)',
    attempt: () =>
      unchanged(OPERATOR.list, async () => {
        const { apiVersion, kind } = fx.identity(OPERATOR.list);
        return deniedForSecret(
          await api(mallory, 'PATCH', identityPath(OPERATOR.list, '?fieldManager=mallory&force=true'), {
            contentType: 'application/apply-patch+yaml',
            body: {
              apiVersion,
              kind,
              metadata: { name: OPERATOR.list },
              spec: { allowedNamespaces: { list: [tenantA, tenantB] } },
            },
          }),
        );
      }),
  },
  {
    what: 'JSON patch: add a name to the list',
    attempt: () =>
      patchDenied(
        OPERATOR.list,
        [{ op: 'add', path: '/spec/allowedNamespaces/list/-', value: tenantB }],
        'application/json-patch+json',
      ),
  },
  {
    what: 'JSON patch: replace secretRef with a test that passes first',
    attempt: () =>
      patchDenied(
        OPERATOR.list,
        [
          { op: 'test', path: '/spec/secretRef/name', value: 'creds' },
          { op: 'replace', path: '/spec/secretRef/name', value: 'other-creds' },
        ],
        'application/json-patch+json',
        `${secretsNs}/other-creds`,
      ),
  },
  {
    what: 'strategic merge patch (not applicable to custom resources)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const r = await api(mallory, 'PATCH', identityPath(OPERATOR.list), {
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
        deniedForSecret(
          await api(mallory, 'PUT', identityPath(OPERATOR.list), { body: wider(await read(OPERATOR.list)) }),
        ),
      ),
  },
  {
    what: 'PUT without a resourceVersion (an unconditional replace), widened',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const o = wider(await read(OPERATOR.list));
        const body = { ...o, metadata: { ...o.metadata, resourceVersion: undefined } };
        // Custom resources allow no unconditional update: refused before admission is asked.
        const r = await api(mallory, 'PUT', identityPath(OPERATOR.list), { body });
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
          await api(mallory, 'PUT', identityPath(OPERATOR.list, '?dryRun=All'), {
            body: wider(await read(OPERATOR.list)),
          }),
        ),
      ),
  },
  {
    what: 'the status subresource: PUT …/status and a merge patch of it carrying a wider spec',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const o = wider(await read(OPERATOR.list));
        const put = await api(mallory, 'PUT', identityPath(OPERATOR.list, '/status'), { body: o });
        const patch = await api(mallory, 'PATCH', identityPath(OPERATOR.list, '/status'), {
          contentType: MERGE,
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
        return deniedForSecret(await api(mallory, 'PUT', identityPath(OPERATOR.list), { body }));
      }),
  },
  {
    what: 'impersonating a user who may read the Secret (Impersonate-User)',
    attempt: async () =>
      unchanged(OPERATOR.list, async () => {
        const r = await api(mallory, 'PUT', identityPath(OPERATOR.list), {
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
      const deleted = await api(mallory, 'DELETE', identityPath(name));
      assert.equal(deleted.status, 200, `deleting an unused identity needs no Secret access: ${deleted.message}`);
      await eventually('the identity to be gone', async () => !(await exists(name)));
      const body = { ...o, metadata: { name, labels: o.metadata.labels } };
      const r = await api(mallory, 'POST', identityPath(), { body });
      assert.equal(await exists(name), false, 'not re-created');
      return `delete 200, create ${deniedForSecret(r)}`;
    },
  },
];

describe('privilege: a user who may not get the Secret cannot point an identity at it or widen one', () => {
  it('every attempt in the table is refused; relabelling a namespace is the one way, by design', async (t) => {
    const failures: string[] = [];
    let n = 0;
    for (const row of ATTEMPTS) {
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
      isNamespaceAllowed(sel.spec.allowedNamespaces, {
        name: tenantB,
        labels: (await w.read(fx.namespace(tenantB)))?.metadata?.labels ?? {},
      });
    assert.equal(await allowed(), false, `${tenantB} starts outside the selector's set`);
    const gold = { contentType: MERGE, body: { metadata: { labels: { [TIER]: 'gold' } } } };
    const byMallory = await api(mallory, 'PATCH', `/api/v1/namespaces/${tenantB}`, gold);
    assert.equal(byMallory.status, 403, 'mallory may not label namespaces');
    const reviewed = () => hook.log.entries().filter((e) => e.message === 'reviewed').length;
    const reviews = reviewed();
    const byLabeller = await api(labeller, 'PATCH', `/api/v1/namespaces/${tenantB}`, gold);
    assert.equal(byLabeller.status, 200, byLabeller.message);
    assert.equal(await allowed(), true, `${tenantB} is now in ${OPERATOR.selector}'s set`);
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(reviewed(), reviews, 'no review was made');
    t.diagnostic(
      `${String(n + 1).padStart(2)}. ALLOWED BY DESIGN — a user who may patch namespaces labels ${tenantB} ${TIER}=gold: ` +
        `it joins the selector identity's set with no admission review (mallory, who may not label namespaces, got ${byMallory.status})`,
    );
    t.diagnostic(`${ATTEMPTS.length} bypass attempts, ${failures.length} not refused`);
    assert.deepEqual(failures, []);
  });

  it('no Secret value in any answer the attacker saw or in the webhook log', () => {
    assertNoSecret(seen.join('\n'), planted, 'API answers');
    assertNoSecret(hook.log.lines.join('\n'), planted, 'admission logs');
  });
});
