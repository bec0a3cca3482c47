/**
 * SPEC §15: nothing foreign reaches an output. The threat: a reverse proxy at the
 * kubeconfig's server URL whose error page echoes the request headers would put mirror-sync's
 * own ServiceAccount token into a log line and HTTP answers if the server's text were kept.
 *
 * Here the functions run as their shipped ServiceAccounts (TokenRequest tokens, so the proxy
 * sees the Authorization header) through a reverse proxy in front of the real API server
 * (fault-proxy.ts, forwarding their own credentials) that, for chosen requests, answers (a) an HTML page echoing every request header and a
 * token-shaped sentinel, (b) an RBAC-shaped 403 Status carrying the sentinel, (c) a Status
 * whose details and causes carry it, (d) a reset connection, and a kubeconfig pointing at a
 * closed port; (e) a real RBAC denial comes from the real API server, whose exact sentence
 * may be quoted. Logs at every level, HTTP answers, conditions, Events and identity status
 * are scanned for the sentinel and the tokens.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { KubeConfig } from '@kubernetes/client-node';
import { IDENTITY_RESOURCE, TERRAFORM_CLUSTER, type Consumer } from '../../functions/lib/api.ts';
import { rbacForbiddenMessages, untrustedServerMessage } from '../../functions/lib/api-errors.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { describeError, makeClients } from '../../functions/lib/kube.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { consumerObjects } from '../../functions/lib/objects.ts';
import { serviceAccountKubeConfig } from '../../scripts/lib/serviceaccount.ts';
import { controlPlaneDir, suffix } from '../helpers/cluster.ts';
import { pingEvent, postEvents, UNSIGNED_EVENTS, type EventTarget } from '../helpers/events.ts';
import { headerEchoPage, startFaultProxy, withServer, type Answer, type FaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { captureLogger, type CapturedLog } from '../helpers/logs.ts';
import { consumerEvent, deliver, keyEvent } from '../helpers/mirror-sync.ts';
import { scanLater } from '../helpers/leaks.ts';

const w = fx.world('untrusted');
const a = w.clients;
/** Token-shaped (a JWT's look), unique to this run. */
const SENTINEL = `eyJ${randomBytes(18).toString('base64url')}.${randomBytes(30).toString('base64url')}`;
const SCOPE_LABEL = 'captf-test/untrusted-text';
const SCOPE_VALUE = suffix();
const ACCOUNTS = ['captf-mirror-sync', 'captf-identity-status', 'captf-admission'] as const;
type Sa = (typeof ACCOUNTS)[number] | 'captf-nobody';

/** Everything a function said: answers here; logs through captureLogger (also scanned by leaks.ts). */
const said: string[] = [];
scanLater('HTTP answers, conditions, Events and status', () => said.join('\n'));
const logs = new Map<string, string[]>();
const tokens: string[] = [];
let home: string;
const running: FunctionHandle[] = [];

/** What the proxy answers instead of the API server, made from the request, by `<METHOD> <path>`. */
type Fault = (req: IncomingMessage) => Answer;
const faults = new Map<string, Fault>();
let proxy: FaultProxy | undefined;

/** (a) an error page as a careless proxy writes one: every request header, then the sentinel. */
const html =
  (status: number): Fault =>
  (req) => ({ status, contentType: 'text/html', body: headerEchoPage(req.headers, SENTINEL) });
/** (d) a reset connection. */
const reset: Fault = () => ({ reset: true });
const authorizationOf = (req: IncomingMessage) => String(req.headers.authorization ?? '');

/** Each ServiceAccount the functions run as here: its kubeconfig through the proxy, and its username. */
const accounts = new Map<Sa, { kc: KubeConfig; user: string }>();
const userOf = (sa: Sa) => accounts.get(sa)!.user;

/** `kc` with the proxy as its server; its token is remembered for the scan. */
function throughProxy(kc: KubeConfig): KubeConfig {
  tokens.push(kc.getCurrentUser()!.token!);
  return withServer(kc, proxy!.url);
}

/** (e) An account without any role: every request but the SelfSubjectReview is denied by RBAC. */
async function nobody(): Promise<{ kc: KubeConfig; user: string }> {
  const namespace = await w.namespace();
  const name = 'captf-nobody';
  await a.core.createNamespacedServiceAccount({ namespace, body: { metadata: { name } } });
  const { kc } = await serviceAccountKubeConfig(a.kc, { namespace, name, dir: `${controlPlaneDir()}/users` });
  return { kc: throughProxy(kc), user: `system:serviceaccount:${namespace}:${name}` };
}

before(async () => {
  home = await w.namespace();
  proxy = await startFaultProxy(
    (method, url, req) => faults.get(`${method} ${new URL(url, 'http://x').pathname}`)?.(req),
    { ownCredentials: true },
  );
  for (const sa of ACCOUNTS) {
    const { clients, user } = await w.account(sa);
    accounts.set(sa, { kc: throughProxy(clients.kc), user });
  }
  accounts.set('captf-nobody', await nobody());
});

after(async () => {
  for (const f of running) await f.close();
  proxy?.close();
  const everything = [...said, ...[...logs.values()].flat()].join('\n');
  assert.ok(!everything.includes(SENTINEL), 'the sentinel reached an output');
  for (const t of tokens) {
    for (const part of [t, ...t.split('.'), t.slice(0, 40), t.slice(-40)])
      assert.ok(part.length < 12 || !everything.includes(part), 'a ServiceAccount token reached an output');
  }
});

/** Starts a function in-process as `sa`, its log captured (every level). */
async function startAs(
  mod: Promise<{ start(o: object): Promise<FunctionHandle> }>,
  sa: Sa,
  opts: { env?: NodeJS.ProcessEnv; kubeconfig?: KubeConfig } = {},
): Promise<{ url: string; lines: string[] }> {
  const log = captureLogger(`${sa}-${suffix()}`);
  const { logger, lines } = log;
  const kubeconfig = opts.kubeconfig ?? accounts.get(sa)!.kc;
  const fn = await (
    await mod
  ).start({ port: 0, host: '127.0.0.1', kubeconfig, logger, env: { ...UNSIGNED_EVENTS, ...opts.env } });
  running.push(fn);
  logs.set(`${sa}-${fn.port}`, lines);
  const url = `http://127.0.0.1:${fn.port}`;
  logged.set(url, log);
  return { url, lines };
}

/** Each function's captured log, by its URL. */
const logged = new Map<string, CapturedLog>();
/** The function at `url` as an event target: what it decided is read from its log. */
const to = (url: string): EventTarget => ({ url: `${url}/`, log: logged.get(url)! });

/** Remembers an output for the final scan and returns it. */
function keep<T>(what: T): T {
  said.push(typeof what === 'string' ? what : JSON.stringify(what));
  return what;
}

/** A source Secret, an identity in this file's scope allowing `n`, and a consumer in `n` that uses it. */
async function inUse(n: string) {
  const source = await w.create(fx.sourceSecret(w.name('src'), fx.inNamespace(home)));
  const { name, namespace } = source.metadata as { name: string; namespace: string };
  const id = w.name('id');
  await w.create(
    fx.identity(id, fx.secretRef(namespace, name), fx.allowList(n), fx.labels({ [SCOPE_LABEL]: SCOPE_VALUE })),
  );
  const c = await w.create(fx.consumer(w.name('c'), fx.inNamespace(n), fx.identityRef(id)));
  return { id, c, source: { name, namespace } };
}

/** The consumer's CredentialsMirrored condition and its namespace's Events, kept for the scan. */
async function conditionAndEvents(c: Consumer) {
  const cond = fx.conditionOf((await w.read(c))!, 'CredentialsMirrored');
  const events = await a.events.listNamespacedEvent({ namespace: c.metadata.namespace! });
  keep(cond);
  keep(events.items.map((e) => ({ reason: e.reason, note: e.note })));
  return { cond, notes: events.items.map((e) => e.note ?? '') };
}

const forgedRbac =
  (n: string): Fault =>
  (req) => ({
    status: 403,
    reason: 'Forbidden',
    // RBAC-shaped, but for a user that is not ours: the sentinel, and the header it saw.
    message: `secrets is forbidden: User "${SENTINEL}" cannot create resource "secrets" in API group "" in the namespace "${n}" (${authorizationOf(req)})`,
    details: { kind: 'secrets', name: SENTINEL },
  });
const invalidWithCauses: Fault = (req) => ({
  status: 422,
  reason: 'Invalid',
  message: `Secret "${SENTINEL}" is invalid: ${authorizationOf(req)}`,
  details: {
    name: SENTINEL,
    kind: SENTINEL,
    causes: [
      { reason: 'FieldValueInvalid', field: `data.${SENTINEL}`, message: SENTINEL },
      { reason: 'FieldValueInvalid', field: 'metadata.name', message: authorizationOf(req) },
      { reason: SENTINEL, field: 'data', message: SENTINEL },
    ],
  },
});

describe('mirror-sync through a hostile proxy (SPEC §15)', () => {
  let url = '';
  before(async () => {
    ({ url } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync'));
  });

  /** A consumer whose mirror create gets `fault(namespace)`; delivers its event (answered 200) and reads the outcome. */
  async function mirrorCreateAnswered(fault: (n: string) => Fault) {
    const n = await w.namespace();
    const { id, c } = await inUse(n);
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, fault(n));
    const r = keep(await deliver(to(url), consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 200, r.text);
    const refused = `the API server refused to create mirror Secret ${n}/${mirrorName(id)}: `;
    return { n, id, c, refused, ...(await conditionAndEvents(c)) };
  }

  it('(a) an HTML page echoing our headers, answered to the mirror create, gives only the code', async () => {
    const { n, id, refused, cond, notes } = await mirrorCreateAnswered(() => html(403));
    assert.equal(cond?.reason, 'MirrorFailed');
    assert.equal(
      cond?.message,
      `${refused}HTTP 403 (create secrets in namespace "${n}" as "${userOf('captf-mirror-sync')}")`,
    );
    assert.ok(notes.some((t) => t.includes('HTTP 403 (create secrets')));
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, html(502));
    // The key's reconcile (the consumer, decided, would only echo).
    const retry = keep(await deliver(to(url), keyEvent(n, id), { retries: 0 }));
    assert.equal(retry.status, 503, retry.text);
    assert.match(retry.text, /HTTP 502 \(create secrets in namespace/);
  });

  it('(b) an RBAC-shaped 403 for another user is withheld; the condition names our user and the request', async () => {
    const { n, refused, cond } = await mirrorCreateAnswered(forgedRbac);
    assert.equal(
      cond?.message,
      `${refused}HTTP 403 Forbidden (create secrets in namespace "${n}" as "${userOf('captf-mirror-sync')}"): ` +
        'refused (by a policy or webhook); its message is withheld',
    );
  });

  it("(c) a Status's details and causes keep only Kubernetes words and field paths", async () => {
    const { n, refused, cond } = await mirrorCreateAnswered(() => invalidWithCauses);
    assert.equal(
      cond?.message,
      `${refused}HTTP 422 Invalid (create secrets in namespace "${n}"); ` +
        'causes: FieldValueInvalid, metadata.name FieldValueInvalid',
    );
  });

  it('(d) a reset connection and a closed port name their codes', async () => {
    const n = await w.namespace();
    const { c } = await inUse(n);
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, reset);
    const r = keep(await deliver(to(url), consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 503, r.text);
    assert.match(r.text, /transport error \(create secrets in namespace [^)]*\): (UND_ERR_SOCKET|ECONNRESET)/);
    const closed = createServer();
    await new Promise<void>((res) => closed.listen(0, '127.0.0.1', () => res()));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((res) => closed.close(res));
    const dead = withServer(accounts.get('captf-mirror-sync')!.kc, `https://127.0.0.1:${port}`);
    const { url: deadUrl, lines } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync', {
      kubeconfig: dead,
    });
    const d = keep(await deliver(to(deadUrl), consumerEvent(c), { retries: 0 }));
    assert.equal(d.status, 503, d.text);
    assert.match(
      d.text,
      new RegExp(`transport error \\((get|list) ${TERRAFORM_CLUSTER.plural}\\.[^)]*\\): ECONNREFUSED`),
    );
    assert.ok(
      lines.some((l) => l.includes('ECONNREFUSED')),
      lines.join('\n'),
    );
  });

  it('(f) who we are comes from our own token: a forged SelfSubjectReview cannot get a name quoted', async () => {
    const n = await w.namespace();
    const { c } = await inUse(n);
    // Our user as the proxy would like it to be, and an RBAC sentence written for exactly that user.
    faults.set('POST /apis/authentication.k8s.io/v1/selfsubjectreviews', () => ({
      status: 201,
      contentType: 'application/json',
      body: JSON.stringify({
        kind: 'SelfSubjectReview',
        apiVersion: 'authentication.k8s.io/v1',
        status: { userInfo: { username: SENTINEL } },
      }),
    }));
    const { url: fresh } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync');
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, () => ({
      status: 403,
      reason: 'Forbidden',
      message: `secrets is forbidden: User "${SENTINEL}" cannot create resource "secrets" in API group "" in the namespace "${n}"`,
    }));
    keep(await deliver(to(fresh), consumerEvent(c), { retries: 0 }));
    const { cond } = await conditionAndEvents(c);
    assert.match(cond?.message ?? '', new RegExp(`as "${userOf('captf-mirror-sync')}"\\): refused \\(by a policy`));
    faults.delete('POST /apis/authentication.k8s.io/v1/selfsubjectreviews');
  });

  it('(g) a 200 page instead of the source is no empty Secret: the mirror keeps its copy, the event is retried', async () => {
    const n = await w.namespace();
    const { id, c, source } = await inUse(n);
    assert.equal(keep(await deliver(to(url), consumerEvent(c), { retries: 0 })).status, 200);
    const mirror = fx.mirrorOf(id, fx.inNamespace(n));
    const before = (await w.read(mirror))?.data;
    faults.set(`GET /api/v1/namespaces/${source.namespace}/secrets/${source.name}`, html(200));
    const r = keep(await deliver(to(url), keyEvent(n, id), { retries: 0 }));
    assert.equal(r.status, 503, r.text);
    assert.match(r.text, /is not that Secret/);
    assert.deepEqual((await w.read(mirror))?.data, before);
    assert.equal((await conditionAndEvents(c)).cond?.reason, 'Mirrored');
    faults.delete(`GET /api/v1/namespaces/${source.namespace}/secrets/${source.name}`);
  });

  it('(e) a real RBAC denial is quoted exactly as the API server wrote it', async () => {
    const n = await w.namespace();
    const { c } = await inUse(n);
    const { url: nobody } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-nobody');
    const r = keep(await deliver(to(nobody), consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 503, r.text);
    // The sentence as kube-apiserver wrote it (its exact form is checked in the next test).
    const answer = JSON.stringify(r.body);
    assert.match(
      answer,
      new RegExp(
        `${TERRAFORM_CLUSTER.plural}\\.${TERRAFORM_CLUSTER.group.replaceAll('.', '\\.')}( \\\\"[^\\\\]+\\\\")? is forbidden: User `,
      ),
    );
    assert.ok(answer.includes(`cannot `) && answer.includes(userOf('captf-nobody')), answer);
  });
});

describe('the RBAC sentence matches the real API server for every request shape', () => {
  it('namespaced get, create without a name, list across namespaces, status patch, cluster-scoped create', async () => {
    const n = await w.namespace();
    const nobody = makeClients(accounts.get('captf-nobody')!.kc);
    const calls: [string, () => Promise<unknown>][] = [
      ['get', () => nobody.core.readNamespacedSecret({ name: 'x', namespace: n })],
      ['create', () => nobody.core.createNamespacedSecret({ namespace: n, body: { metadata: { name: 'x' } } })],
      ['list', () => nobody.core.listSecretForAllNamespaces()],
      [
        'patch status',
        () =>
          consumerObjects(nobody, TERRAFORM_CLUSTER).applyStatus({ metadata: { name: 'c', namespace: n }, status: {} }),
      ],
      ['sar', () => nobody.authz.createSubjectAccessReview({ body: { spec: { user: 'u', resourceAttributes: {} } } })],
      ['namespace', () => nobody.core.readNamespace({ name: n })],
    ];
    for (const [what, call] of calls) {
      const err = await call().then(
        () => assert.fail(`${what} was allowed`),
        (e: unknown) => e,
      );
      const real = untrustedServerMessage(err);
      const text = keep(describeError(err));
      assert.ok(text.endsWith(`: ${real}`), `${what}: the real sentence\n  ${real}\nis quoted in\n  ${text}`);
      assert.match(text, new RegExp(`^HTTP 403 Forbidden \\(.* as "${userOf('captf-nobody')}"\\): `));
    }
    assert.equal(
      rbacForbiddenMessages(
        { verb: 'get', group: '', resource: 'namespaces', subresource: '', namespace: n, name: n },
        userOf('captf-nobody'),
      )[0],
      untrustedServerMessage(await nobody.core.readNamespace({ name: n }).catch((e: unknown) => e)),
    );
  });
});

describe('identity-status through a hostile proxy (SPEC §15)', () => {
  const { group, version, plural } = IDENTITY_RESOURCE;
  const list = `GET /apis/${group}/${version}/${plural}`;
  let url = '';
  let lines: string[] = [];
  before(async () => {
    ({ url, lines } = await startAs(import('../../functions/identity-status/index.ts'), 'captf-identity-status', {
      env: { CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${SCOPE_VALUE}` },
    }));
    await inUse(await w.namespace());
  });
  after(() => faults.delete(list));

  for (const [name, fault, expect] of [
    ['(a) HTML echoing our headers', html(500), new RegExp(`HTTP 500 \\(list ${plural}\\.`)],
    ['(b) an RBAC-shaped 403', forgedRbac('x'), /withheld/],
    ['(c) details and causes', invalidWithCauses, /causes: FieldValueInvalid/],
    ['(d) a reset connection', reset, new RegExp(`transport error \\(list ${plural}[^)]*\\): `)],
  ] as const) {
    it(`${name}: the ping's answer and log give only what the product knows`, async () => {
      faults.set(list, fault);
      const r = keep(await postEvents(to(url), pingEvent('captf-identity-status')));
      assert.ok(r.status >= 500, r.text);
      assert.match(r.text, expect);
      assert.ok(
        lines.some((l) => expect.test(l)),
        lines.join('\n'),
      );
    });
  }

  it('(c) a refused status write leaves the identity status and the answer free of foreign text', async () => {
    faults.delete(list);
    const n = await w.namespace();
    const { id } = await inUse(n);
    faults.set(`PATCH /apis/${group}/${version}/${plural}/${id}/status`, invalidWithCauses);
    const r = keep(await postEvents(to(url), pingEvent('captf-identity-status')));
    assert.match(r.text, new RegExp(`HTTP 422 Invalid \\(patch ${plural}\\.[^)]*/status \\\\"${id}\\\\"`));
    keep(await w.read(fx.identity(id)));
  });
});

describe('admission SubjectAccessReview through a hostile proxy (SPEC §15)', () => {
  const sar = 'POST /apis/authorization.k8s.io/v1/subjectaccessreviews';
  const review = (uid: string) =>
    JSON.stringify({
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid,
        operation: 'CREATE',
        name: 'x',
        userInfo: { username: 'alice', groups: ['g'] },
        object: fx.identity('x'),
      },
    });
  async function ask(url: string, uid: string): Promise<string> {
    const res = await fetch(`${url}/validate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: review(uid),
    });
    const text = keep(await res.text());
    const answer = JSON.parse(text) as { response: { allowed: boolean; status?: { message?: string } } };
    assert.equal(answer.response.allowed, false, text);
    return answer.response.status?.message ?? '';
  }
  after(() => faults.delete(sar));

  it('a forged 403 and an HTML page are withheld; a real RBAC denial is quoted', async () => {
    const env = { CAPTF_ADMISSION_PLAIN_HTTP: 'true' };
    const { url } = await startAs(import('../../functions/admission/index.ts'), 'captf-admission', { env });
    faults.set(sar, forgedRbac('x'));
    const forged = await ask(url, 'forged');
    assert.match(
      forged,
      new RegExp(
        `SubjectAccessReview failed: HTTP 403 Forbidden \\(create subjectaccessreviews\\.authorization\\.k8s\\.io ` +
          `as "${userOf('captf-admission')}"\\): refused \\(by a policy or webhook\\); its message is withheld\\)`,
      ),
    );
    faults.set(sar, html(403));
    assert.match(await ask(url, 'html'), /SubjectAccessReview failed: HTTP 403 \(create subjectaccessreviews/);
    faults.delete(sar);
    const { url: nobody } = await startAs(import('../../functions/admission/index.ts'), 'captf-nobody', { env });
    const real = await ask(nobody, 'real');
    const sentence =
      `subjectaccessreviews.authorization.k8s.io is forbidden: User "${userOf('captf-nobody')}" cannot create ` +
      'resource "subjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope';
    assert.ok(real.includes(sentence), real);
  });
});

describe('nothing foreign anywhere', () => {
  it('no log line at any level, answer, condition, Event or status carries the sentinel or a token', async () => {
    const everything = [...said, ...[...logs.values()].flat()].join('\n');
    assert.ok(said.length > 10 && logs.size >= 4);
    assert.ok(!everything.includes(SENTINEL), 'the sentinel reached an output');
    for (const t of tokens) assert.ok(!everything.includes(t.slice(0, 40)), 'a token reached an output');
  });
});
