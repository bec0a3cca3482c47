/**
 * SPEC §15: nothing foreign reaches an output. The threat: a reverse proxy at the
 * kubeconfig's server URL whose error page echoes the request headers would put mirror-sync's
 * own ServiceAccount token into a log line and HTTP answers if the server's text were kept.
 *
 * Here the functions run as their shipped ServiceAccounts (TokenRequest tokens, so the proxy
 * sees the Authorization header) through a reverse proxy in front of the real API server
 * that, for chosen requests, answers (a) an HTML page echoing every request header and a
 * token-shaped sentinel, (b) an RBAC-shaped 403 Status carrying the sentinel, (c) a Status
 * whose details and causes carry it, (d) a reset connection, and a kubeconfig pointing at a
 * closed port; (e) a real RBAC denial comes from the real API server, whose exact sentence
 * may be quoted. Logs at every level, HTTP answers, conditions, Events and identity status
 * are scanned for the sentinel and the tokens.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
import { API_VERSION, GROUP, IDENTITY_PLURAL, VERSION } from '../../functions/lib/api.ts';
import { rbacForbiddenMessages, untrustedServerMessage } from '../../functions/lib/api-errors.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { describeError, makeClients } from '../../functions/lib/kube.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { installRbac, serviceAccountKubeConfig } from '../../scripts/lib/serviceaccount.ts';
import { admin, controlPlaneDir, namespaces, suffix } from '../helpers/cluster.ts';
import { pingEvent, postEvents } from '../helpers/events.ts';
import { captureLogger } from '../helpers/logs.ts';
import {
  conditionOf,
  consumerEvent,
  createConsumer,
  deliver,
  getConsumer,
  putIdentity,
} from '../helpers/mirror-sync.ts';
import { scanLater } from '../helpers/leaks.ts';

const a = admin();
const ns = namespaces('untrusted');
/** Token-shaped (a JWT's look), unique to this run. */
const SENTINEL = `eyJ${randomBytes(18).toString('base64url')}.${randomBytes(30).toString('base64url')}`;
const SCOPE_LABEL = 'captf-test/untrusted-text';
const SCOPE_VALUE = suffix();
const ACCOUNTS = ['captf-mirror-sync', 'captf-identity-status', 'captf-admission'] as const;
type Account = (typeof ACCOUNTS)[number] | 'captf-nobody';

/** Everything a function said: answers here; logs through captureLogger (also scanned by leaks.ts). */
const said: string[] = [];
scanLater('HTTP answers, conditions, Events and status', () => said.join('\n'));
const logs = new Map<string, string[]>();
const tokens: string[] = [];
let home: string;
let cleanup: () => Promise<void> = async () => undefined;
const running: FunctionHandle[] = [];

/** What the proxy answers instead of the API server, by `<METHOD> <path>`. */
type Fault =
  | { kind: 'html'; code: number }
  | { kind: 'status'; code: number; status: (authorization: string) => Record<string, unknown> }
  | { kind: 'json'; code: number; body: Record<string, unknown> }
  | { kind: 'reset' };
const faults = new Map<string, Fault>();
let proxyUrl = '';
let proxy: ReturnType<typeof createServer> | undefined;

/** (a) an error page as a careless proxy writes one: every request header, then the sentinel. */
function htmlPage(req: IncomingMessage): string {
  const rows = Object.entries(req.headers).map(([k, v]) => `<tr><td>${k}</td><td>${String(v)}</td></tr>`);
  return `<html><body><h1>Upstream error</h1><table>${rows.join('')}</table><p>${SENTINEL}</p></body></html>`;
}

function answerFault(f: Fault, req: IncomingMessage, res: ServerResponse): void {
  req.resume();
  if (f.kind === 'reset') {
    req.socket.destroy();
    return;
  }
  if (f.kind === 'html') {
    res.writeHead(f.code, { 'content-type': 'text/html' }).end(htmlPage(req));
    return;
  }
  if (f.kind === 'json') {
    res.writeHead(f.code, { 'content-type': 'application/json' }).end(JSON.stringify(f.body));
    return;
  }
  const body = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', code: f.code };
  res.writeHead(f.code, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ ...body, ...f.status(String(req.headers.authorization ?? '')) }));
}

/** A plain-HTTP reverse proxy to the test API server that forwards the client's own credentials. */
async function startProxy(): Promise<void> {
  const target = new URL(a.kc.getCurrentCluster()!.server);
  const ca = Buffer.from(a.kc.getCurrentCluster()!.caData!, 'base64');
  proxy = createServer((req, res) => {
    const f = faults.get(`${req.method} ${new URL(req.url ?? '/', 'http://x').pathname}`);
    if (f) return answerFault(f, req, res);
    const up = httpsRequest(
      {
        host: target.hostname,
        port: target.port,
        path: req.url,
        method: req.method,
        headers: { ...req.headers, host: target.host },
        ca,
      },
      (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  await new Promise<void>((r) => proxy!.listen(0, '127.0.0.1', () => r()));
  proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
}

/** A kubeconfig with `token` whose server is `server` (the proxy, or a closed port). */
function tokenKubeConfig(token: string, server: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    // Plain HTTP (the proxy): client-node allows it only with skipTLSVerify.
    clusters: [{ name: 'proxy', server, skipTLSVerify: true }],
    users: [{ name: 'sa', token }],
    contexts: [{ name: 'sa', cluster: 'proxy', user: 'sa' }],
    currentContext: 'sa',
  });
  return kc;
}

const kubeconfigs = new Map<Account, KubeConfig>();
const userOf = (sa: Account) => `system:serviceaccount:${home}:${sa}`;

/** A ServiceAccount's TokenRequest token (remembered for the scan). */
async function tokenOf(sa: Account): Promise<string> {
  const { kc } = await serviceAccountKubeConfig(a.kc, { namespace: home, name: sa, dir: `${controlPlaneDir()}/users` });
  const token = kc.getCurrentUser()!.token!;
  tokens.push(token);
  return token;
}

before(async () => {
  home = await ns.create();
  await startProxy();
  const objects: KubernetesObject[] = await render('manifests/overlays/without-crds');
  const rbac = await installRbac(a.kc, objects, { namespace: home, suffix: suffix() });
  cleanup = rbac.cleanup;
  // (e) An account without any role: every request but the SelfSubjectReview is denied by RBAC.
  await a.core.createNamespacedServiceAccount({ namespace: home, body: { metadata: { name: 'captf-nobody' } } });
  for (const sa of [...ACCOUNTS, 'captf-nobody'] as const)
    kubeconfigs.set(sa, tokenKubeConfig(await tokenOf(sa), proxyUrl));
});

after(async () => {
  for (const f of running) await f.close();
  proxy?.close();
  await cleanup();
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
  sa: Account,
  opts: { env?: NodeJS.ProcessEnv; kubeconfig?: KubeConfig } = {},
): Promise<{ url: string; lines: string[] }> {
  const { logger, lines } = captureLogger(`${sa}-${suffix()}`);
  const kubeconfig = opts.kubeconfig ?? kubeconfigs.get(sa)!;
  const fn = await (await mod).start({ port: 0, host: '127.0.0.1', kubeconfig, logger, env: opts.env ?? {} });
  running.push(fn);
  logs.set(`${sa}-${fn.port}`, lines);
  return { url: `http://127.0.0.1:${fn.port}`, lines };
}

/** Remembers an output for the final scan and returns it. */
function keep<T>(what: T): T {
  said.push(typeof what === 'string' ? what : JSON.stringify(what));
  return what;
}

/** A source Secret, an identity allowing `n`, and a consumer in `n`. */
async function world(n: string) {
  const source = { name: `src-${suffix()}`, namespace: home };
  await a.core.createNamespacedSecret({
    namespace: home,
    body: { metadata: { name: source.name }, data: { KEY: Buffer.from(suffix()).toString('base64') } },
  });
  const id = `untrusted-${suffix()}`;
  ns.onCleanup(() =>
    a.custom.deleteClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: id }),
  );
  await putIdentity(a, id, source, { list: [n] }, { [SCOPE_LABEL]: SCOPE_VALUE });
  const c = await createConsumer(a, n, `c-${suffix()}`, id);
  return { id, c, source };
}

/** The consumer's CredentialsMirrored condition and the namespace's Events, kept for the scan. */
async function conditionAndEvents(n: string, name: string) {
  const cond = conditionOf(await getConsumer(a, n, name), 'CredentialsMirrored');
  const events = await a.events.listNamespacedEvent({ namespace: n });
  keep(cond);
  keep(events.items.map((e) => ({ reason: e.reason, note: e.note })));
  return { cond, notes: events.items.map((e) => e.note ?? '') };
}

const forgedRbac = (n: string) => (authorization: string) => ({
  reason: 'Forbidden',
  // RBAC-shaped, but for a user that is not ours: the sentinel, and the header it saw.
  message: `secrets is forbidden: User "${SENTINEL}" cannot create resource "secrets" in API group "" in the namespace "${n}" (${authorization})`,
  details: { kind: 'secrets', name: SENTINEL },
});
const invalidWithCauses = (authorization: string) => ({
  reason: 'Invalid',
  message: `Secret "${SENTINEL}" is invalid: ${authorization}`,
  details: {
    name: SENTINEL,
    kind: SENTINEL,
    causes: [
      { reason: 'FieldValueInvalid', field: `data.${SENTINEL}`, message: SENTINEL },
      { reason: 'FieldValueInvalid', field: 'metadata.name', message: authorization },
      { reason: SENTINEL, field: 'data', message: SENTINEL },
    ],
  },
});

describe('mirror-sync through a hostile proxy (SPEC §15)', () => {
  let url = '';
  before(async () => {
    ({ url } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync'));
  });

  it('(a) an HTML page echoing our headers, answered to the mirror create, gives only the code', async () => {
    const n = await ns.create();
    const { id, c } = await world(n);
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, { kind: 'html', code: 403 });
    const r = keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 200, r.text);
    const { cond, notes } = await conditionAndEvents(n, c.metadata.name!);
    assert.equal(cond?.reason, 'MirrorFailed');
    assert.equal(
      cond?.message,
      `the API server refused to create mirror Secret ${n}/${mirrorName(id)}: ` +
        `HTTP 403 (create secrets in namespace "${n}" as "${userOf('captf-mirror-sync')}")`,
    );
    assert.ok(notes.some((t) => t.includes('HTTP 403 (create secrets')));
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, { kind: 'html', code: 502 });
    const retry = keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(retry.status, 503, retry.text);
    assert.match(retry.text, /HTTP 502 \(create secrets in namespace/);
  });

  it('(b) an RBAC-shaped 403 for another user is withheld; the condition names our user and the request', async () => {
    const n = await ns.create();
    const { id, c } = await world(n);
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, { kind: 'status', code: 403, status: forgedRbac(n) });
    const r = keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 200, r.text);
    const { cond } = await conditionAndEvents(n, c.metadata.name!);
    assert.equal(
      cond?.message,
      `the API server refused to create mirror Secret ${n}/${mirrorName(id)}: HTTP 403 Forbidden ` +
        `(create secrets in namespace "${n}" as "${userOf('captf-mirror-sync')}"): ` +
        'refused (by a policy or webhook); its message is withheld',
    );
  });

  it("(c) a Status's details and causes keep only Kubernetes words and field paths", async () => {
    const n = await ns.create();
    const { id, c } = await world(n);
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, { kind: 'status', code: 422, status: invalidWithCauses });
    const r = keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 200, r.text);
    const { cond } = await conditionAndEvents(n, c.metadata.name!);
    assert.equal(
      cond?.message,
      `the API server refused to create mirror Secret ${n}/${mirrorName(id)}: HTTP 422 Invalid ` +
        `(create secrets in namespace "${n}"); causes: FieldValueInvalid, metadata.name FieldValueInvalid`,
    );
  });

  it('(d) a reset connection and a closed port name their codes', async () => {
    const n = await ns.create();
    const { c } = await world(n);
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, { kind: 'reset' });
    const r = keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 503, r.text);
    assert.match(r.text, /transport error \(create secrets in namespace [^)]*\): (UND_ERR_SOCKET|ECONNRESET)/);
    const closed = createServer();
    await new Promise<void>((res) => closed.listen(0, '127.0.0.1', () => res()));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((res) => closed.close(res));
    const dead = tokenKubeConfig(tokens[0]!, `http://127.0.0.1:${port}`);
    const { url: deadUrl, lines } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync', {
      kubeconfig: dead,
    });
    const d = keep(await deliver(`${deadUrl}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(d.status, 503, d.text);
    assert.match(d.text, /transport error \((get|list) terraformclusters\.[^)]*\): ECONNREFUSED/);
    assert.ok(
      lines.some((l) => l.includes('ECONNREFUSED')),
      lines.join('\n'),
    );
  });

  it('(f) who we are comes from our own token: a forged SelfSubjectReview cannot get a name quoted', async () => {
    const n = await ns.create();
    const { c } = await world(n);
    // Our user as the proxy would like it to be, and an RBAC sentence written for exactly that user.
    faults.set('POST /apis/authentication.k8s.io/v1/selfsubjectreviews', {
      kind: 'json',
      code: 201,
      body: {
        kind: 'SelfSubjectReview',
        apiVersion: 'authentication.k8s.io/v1',
        status: { userInfo: { username: SENTINEL } },
      },
    });
    const { url: fresh } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-mirror-sync');
    faults.set(`POST /api/v1/namespaces/${n}/secrets`, {
      kind: 'status',
      code: 403,
      status: () => ({
        reason: 'Forbidden',
        message: `secrets is forbidden: User "${SENTINEL}" cannot create resource "secrets" in API group "" in the namespace "${n}"`,
      }),
    });
    keep(await deliver(`${fresh}/`, consumerEvent(c), { retries: 0 }));
    const { cond } = await conditionAndEvents(n, c.metadata.name!);
    assert.match(cond?.message ?? '', new RegExp(`as "${userOf('captf-mirror-sync')}"\\): refused \\(by a policy`));
    faults.delete('POST /apis/authentication.k8s.io/v1/selfsubjectreviews');
  });

  it('(g) a 200 page instead of the source is no empty Secret: the mirror keeps its copy, the event is retried', async () => {
    const n = await ns.create();
    const { id, c, source } = await world(n);
    assert.equal(keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 })).status, 200);
    const before = (await a.core.readNamespacedSecret({ namespace: n, name: mirrorName(id) })).data;
    faults.set(`GET /api/v1/namespaces/${source.namespace}/secrets/${source.name}`, { kind: 'html', code: 200 });
    const r = keep(await deliver(`${url}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 503, r.text);
    assert.match(r.text, /is not that Secret/);
    assert.deepEqual((await a.core.readNamespacedSecret({ namespace: n, name: mirrorName(id) })).data, before);
    assert.equal((await conditionAndEvents(n, c.metadata.name!)).cond?.reason, 'Mirrored');
    faults.delete(`GET /api/v1/namespaces/${source.namespace}/secrets/${source.name}`);
  });

  it('(e) a real RBAC denial is quoted exactly as the API server wrote it', async () => {
    const n = await ns.create();
    const { c } = await world(n);
    const { url: nobody } = await startAs(import('../../functions/mirror-sync/index.ts'), 'captf-nobody');
    const r = keep(await deliver(`${nobody}/`, consumerEvent(c), { retries: 0 }));
    assert.equal(r.status, 503, r.text);
    // The sentence as kube-apiserver wrote it (its exact form is checked in the next test).
    const answer = JSON.stringify(r.body);
    assert.match(
      answer,
      new RegExp(`terraformclusters\\.${GROUP.replaceAll('.', '\\.')}( \\\\"[^\\\\]+\\\\")? is forbidden: User `),
    );
    assert.ok(answer.includes(`cannot `) && answer.includes(userOf('captf-nobody')), answer);
  });
});

describe('the RBAC sentence matches the real API server for every request shape', () => {
  it('namespaced get, create without a name, list across namespaces, status patch, cluster-scoped create', async () => {
    const n = await ns.create();
    const nobody = makeClients(kubeconfigs.get('captf-nobody')!);
    const calls: [string, () => Promise<unknown>][] = [
      ['get', () => nobody.core.readNamespacedSecret({ name: 'x', namespace: n })],
      ['create', () => nobody.core.createNamespacedSecret({ namespace: n, body: { metadata: { name: 'x' } } })],
      ['list', () => nobody.core.listSecretForAllNamespaces()],
      [
        'patch status',
        () =>
          nobody.custom.patchNamespacedCustomObjectStatus({
            group: GROUP,
            version: VERSION,
            namespace: n,
            plural: 'terraformclusters',
            name: 'c',
            body: [],
          }),
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
  const identities = `GET /apis/${GROUP}/${VERSION}/${IDENTITY_PLURAL}`;
  let url = '';
  let lines: string[] = [];
  before(async () => {
    ({ url, lines } = await startAs(import('../../functions/identity-status/index.ts'), 'captf-identity-status', {
      env: { CAPTF_STATUS_IDENTITY_SELECTOR: `${SCOPE_LABEL}=${SCOPE_VALUE}` },
    }));
    await world(await ns.create());
  });
  after(() => faults.delete(identities));

  for (const [name, fault, expect] of [
    ['(a) HTML echoing our headers', { kind: 'html', code: 500 }, /HTTP 500 \(list terraformclusteridentities\./],
    ['(b) an RBAC-shaped 403', { kind: 'status', code: 403, status: forgedRbac('x') }, /withheld/],
    ['(c) details and causes', { kind: 'status', code: 422, status: invalidWithCauses }, /causes: FieldValueInvalid/],
    ['(d) a reset connection', { kind: 'reset' }, /transport error \(list terraformclusteridentities[^)]*\): /],
  ] as const) {
    it(`${name}: the ping's answer and log give only what the product knows`, async () => {
      faults.set(identities, fault as Fault);
      const r = keep(await postEvents(`${url}/`, pingEvent('captf-identity-status')));
      assert.ok(r.status >= 500, r.text);
      assert.match(r.text, expect);
      assert.ok(
        lines.some((l) => expect.test(l)),
        lines.join('\n'),
      );
    });
  }

  it('(c) a refused status write leaves the identity status and the answer free of foreign text', async () => {
    faults.delete(identities);
    const n = await ns.create();
    const { id } = await world(n);
    faults.set(`PATCH /apis/${GROUP}/${VERSION}/${IDENTITY_PLURAL}/${id}/status`, {
      kind: 'status',
      code: 422,
      status: invalidWithCauses,
    });
    const r = keep(await postEvents(`${url}/`, pingEvent('captf-identity-status')));
    assert.match(r.text, new RegExp(`HTTP 422 Invalid \\(patch ${IDENTITY_PLURAL}\\.[^)]*/status \\\\"${id}\\\\"`));
    keep(await a.custom.getClusterCustomObject({ group: GROUP, version: VERSION, plural: IDENTITY_PLURAL, name: id }));
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
        object: {
          apiVersion: API_VERSION,
          kind: 'TerraformClusterIdentity',
          metadata: { name: 'x' },
          spec: { secretRef: { name: 'creds', namespace: 'captf-system' } },
        },
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
    faults.set(sar, { kind: 'status', code: 403, status: forgedRbac('x') });
    const forged = await ask(url, 'forged');
    assert.match(
      forged,
      new RegExp(
        `SubjectAccessReview failed: HTTP 403 Forbidden \\(create subjectaccessreviews\\.authorization\\.k8s\\.io ` +
          `as "${userOf('captf-admission')}"\\): refused \\(by a policy or webhook\\); its message is withheld\\)`,
      ),
    );
    faults.set(sar, { kind: 'html', code: 403 });
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
