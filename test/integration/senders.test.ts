/**
 * SPEC §12, "Who may send an event", through the real API server: mirror-sync and
 * identity-status, each with exactly the RBAC the manifests give it and every API request it
 * makes going through a recording proxy, accept a delivery only with a token the API server
 * authenticates (TokenReview) for the function's own audience from one of its senders, as
 * Knative's Broker signs them for a Trigger's OIDC ServiceAccount, or from a subject a Ready
 * EventPolicy targeting the function names (its status written here as Eventing's reconciler
 * would; the node's serving.test has Eventing's own). Every other delivery is
 * refused 401 or 403 with a body that names nothing, and the function makes no API request
 * for it beyond the TokenReview: no reconcile, nothing read. A verified token is reviewed once
 * while cached; a TokenReview that cannot be made is a 503; with the check off the function
 * says so at start. No token reaches a log line or an answer.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { CoreV1Api, PatchStrategy, setHeaderOptions, type KubeConfig } from '@kubernetes/client-node';
import { EVENT_ANSWER_ID_HEADER } from '../../functions/lib/http.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { refusal } from '../../functions/lib/senders.ts';
import { MAX_REVIEWS_IN_FLIGHT, MAX_REVIEWS_WAITING } from '../../functions/lib/token-review.ts';
import { start as startIdentityStatus } from '../../functions/identity-status/index.ts';
import { start as startMirrorSync } from '../../functions/mirror-sync/index.ts';
import { installEventingCRDs } from '../../scripts/controlplane/crds.ts';
import { serviceAccountToken } from '../../scripts/lib/serviceaccount.ts';
import { eventPolicies, eventPolicy, pingEvent, postEvents, type EventAnswer } from '../helpers/events.ts';
import { startFaultProxy, withServer, type Answer, type FaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { eventually } from '../helpers/cluster.ts';
import { consumerEvent, operatorSource } from '../helpers/mirror-sync.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';

const w = fx.world('senders');
const a = w.clients;
/** Each function's audience, naming it as a Knative Service in its account's namespace (where its EventPolicies live). */
let MIRROR_SYNC_AUDIENCE: string;
let STATUS_AUDIENCE: string;
/** The namespace of mirror-sync's account: its audience names it, its EventPolicies are read there. */
let mirrorSyncHome: string;
const SECRET = sentinel();
const logs = { 'mirror-sync': captureLogger('mirror-sync'), 'identity-status': captureLogger('identity-status') };
/** Every answer's text and headers, and every token minted: the leak scan's material. */
const answers: string[] = [];
/** The `x-request-id` of each refusal asserted, to find in the functions' logs. */
const refusalIds: string[] = [];
const tokens: string[] = [];
/** `METHOD path` of every API request either function made through the proxy. */
const seen: string[] = [];
let fault: (method: string, path: string) => Answer | undefined | Promise<Answer | undefined> = () => undefined;
let proxy: FaultProxy;
const url: Record<'mirror-sync' | 'identity-status', string> = { 'mirror-sync': '', 'identity-status': '' };
let tenant: string;
let idName: string;
/** The senders' namespace: `trigger` may send to both functions, `stranger` to none. */
let senders: string;
const token: Record<string, string> = {};

const isTokenReview = (r: string) => /\/tokenreviews(\?|$)/.test(r);
/** The one other request a refusal may cost: the list of EventPolicies, for a verified stranger. */
const isPolicyList = (r: string) =>
  /^GET \/apis\/eventing\.knative\.dev\/v1alpha1\/namespaces\/[^/]+\/eventpolicies$/.test(r);

/** An event about consumer `name` of `tenant`, which mirror-sync would act on (it makes the mirror). */
const eventAbout = (name: string) =>
  consumerEvent(fx.consumer(name, fx.inNamespace(tenant), fx.identityRef(idName)), 'ref', 'add');

/** POSTs `events` with `authorization` and keeps the answer for the leak scan. */
async function deliver(to: keyof typeof url, events: ReturnType<typeof pingEvent>, authorization?: string) {
  const r = await postEvents(url[to], events, 'binary', undefined, authorization);
  answers.push(r.text, [...r.headers].map(([k, v]) => `${k}: ${v}`).join('\n'));
  return r;
}

/** A JWT with these claims and a signature nobody made: only the TokenReview can tell. */
function forged(aud: string, sub: string): string {
  const part = (o: object) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const exp = Math.floor(Date.now() / 1000) + 600;
  return `${part({ alg: 'RS256', kid: 'forged' })}.${part({ aud: [aud], sub, exp })}.${Buffer.from(sentinel()).toString('base64url')}`;
}

/** Mints a token for ServiceAccount `name` of the senders' namespace, remembered for the leak scan. */
async function mint(name: string, audience?: string): Promise<string> {
  const t = await serviceAccountToken(a.kc, { namespace: senders, name, ...(audience ? { audience } : {}) });
  tokens.push(t);
  return t;
}

/**
 * Starts one function with the shipped RBAC of its account, through the proxy, checking
 * senders for the audience of a Knative Service `captf-<fn>` in the account's namespace.
 * @returns its URL and that audience.
 */
async function startWithSenders(
  fn: keyof typeof url,
  cacheSeconds: string,
): Promise<{ url: string; audience: string; home: string }> {
  const account = await w.account(fn === 'mirror-sync' ? 'captf-mirror-sync' : 'captf-identity-status');
  const home = account.user.split(':')[2]!;
  const audience = `serving.knative.dev/service/${home}/captf-${fn}`;
  const kubeconfig: KubeConfig = withServer(account.clients.kc, proxy.url);
  const start = fn === 'mirror-sync' ? startMirrorSync : startIdentityStatus;
  const env = oidc(audience, cacheSeconds);
  const handle = await start({ port: 0, host: '127.0.0.1', kubeconfig, logger: logs[fn].logger, env });
  w.onCleanup(() => handle.close());
  return { url: `http://127.0.0.1:${handle.port}/`, audience, home };
}

const oidc = (audience: string, cacheSeconds = '60') => ({
  CAPTF_EVENT_AUTH: 'oidc',
  CAPTF_EVENT_AUDIENCE: audience,
  CAPTF_EVENT_SENDERS: `system:serviceaccount:${senders}:trigger`,
  CAPTF_EVENT_AUTH_CACHE_SECONDS: cacheSeconds,
});

before(async () => {
  const source = await operatorSource(w, fx.data({ token: SECRET }));
  tenant = await w.namespace();
  idName = await source.newIdentity(fx.allowList(tenant));
  senders = await w.namespace();
  for (const name of ['trigger', 'stranger'])
    await a.core.createNamespacedServiceAccount({ namespace: senders, body: { metadata: { name } } });
  proxy = await startFaultProxy(
    (method, u) => {
      const path = new URL(u, 'http://x').pathname;
      seen.push(`${method} ${path}`);
      return fault(method, path);
    },
    { ownCredentials: true },
  );
  w.onCleanup(async () => proxy.close());
  // mirror-sync reviews every delivery (no cache), so each refusal's requests can be counted.
  const ms = await startWithSenders('mirror-sync', '0');
  const st = await startWithSenders('identity-status', '60');
  [url['mirror-sync'], MIRROR_SYNC_AUDIENCE, mirrorSyncHome] = [ms.url, ms.audience, ms.home];
  [url['identity-status'], STATUS_AUDIENCE] = [st.url, st.audience];
  token.good = await mint('trigger', MIRROR_SYNC_AUDIENCE);
  token.statusGood = await mint('trigger', STATUS_AUDIENCE);
  token.apiServer = await mint('trigger');
  token.stranger = await mint('stranger', MIRROR_SYNC_AUDIENCE);
});

after(() => {
  const said = [...logs['mirror-sync'].lines, ...logs['identity-status'].lines, ...answers].join('\n');
  assertNoSecret(said, [SECRET, ...tokens], 'logs and answers');
});

/** Asserts a refusal: its status, the constant body, and what the function asked the API server meanwhile. */
function assertRefused(r: EventAnswer, status: 401 | 403, requests: string[], what: string): void {
  assert.equal(r.status, status, `${what}: ${r.text}`);
  assert.deepEqual(r.body, refusal(status === 403 ? 'not-a-sender' : 'invalid-token').body, what);
  refusalIds.push(r.headers.get(EVENT_ANSWER_ID_HEADER) ?? `${what}: no ${EVENT_ANSWER_ID_HEADER}`);
  assert.ok(
    requests.every((r) => isTokenReview(r) || (status === 403 && isPolicyList(r))),
    `${what}: nothing but a TokenReview (and for a verified stranger the EventPolicies) was asked of the API server: ${requests.join(', ')}`,
  );
}

describe('only their own senders reach the event functions (SPEC §12)', () => {
  it('mirror-sync refuses every other delivery before reading it, and reconciles nothing for it', async () => {
    const bound = await a.core.createNamespacedSecret({ namespace: senders, body: { metadata: { name: 'bound' } } });
    const revoked = (
      await a.kc.makeApiClient(CoreV1Api).createNamespacedServiceAccountToken({
        namespace: senders,
        name: 'trigger',
        body: {
          spec: {
            audiences: [MIRROR_SYNC_AUDIENCE],
            expirationSeconds: 3600,
            boundObjectRef: { apiVersion: 'v1', kind: 'Secret', name: 'bound', uid: bound.metadata!.uid },
          },
        },
      })
    ).status!.token!;
    tokens.push(revoked);
    await a.core.deleteNamespacedSecret({ namespace: senders, name: 'bound' });
    const cases: { what: string; authorization: string | undefined; status: 401 | 403; reviews: number }[] = [
      { what: 'no Authorization header', authorization: undefined, status: 401, reviews: 0 },
      { what: 'another scheme', authorization: 'Basic dXNlcjpwYXNz', status: 401, reviews: 0 },
      // A token whose own claims rule it out costs the API server nothing.
      { what: 'a garbage token', authorization: 'Bearer bm90LWEtdG9rZW4', status: 401, reviews: 0 },
      {
        what: "the sender's token for the API server's audience",
        authorization: `Bearer ${token.apiServer}`,
        status: 401,
        reviews: 0,
      },
      {
        what: "the sender's token for identity-status",
        authorization: `Bearer ${token.statusGood}`,
        status: 401,
        reviews: 0,
      },
      {
        what: "a forged JWT claiming this audience and the sender's subject",
        authorization: `Bearer ${forged(MIRROR_SYNC_AUDIENCE, `system:serviceaccount:${senders}:trigger`)}`,
        status: 401,
        reviews: 1,
      },
      { what: 'a token whose bound object is gone', authorization: `Bearer ${revoked}`, status: 401, reviews: 1 },
      {
        what: "another ServiceAccount's token for this audience",
        authorization: `Bearer ${token.stranger}`,
        status: 403,
        reviews: 1,
      },
    ];
    for (const c of cases) {
      const name = w.name('c');
      await w.create(fx.consumer(name, fx.inNamespace(tenant), fx.identityRef(idName)));
      const from = seen.length;
      const r = await deliver('mirror-sync', eventAbout(name), c.authorization);
      const requests = seen.slice(from);
      assertRefused(r, c.status, requests, c.what);
      assert.equal(requests.filter(isTokenReview).length, c.reviews, `${c.what}: TokenReviews made`);
      if (c.status === 401) assert.match(r.headers.get('www-authenticate') ?? '', /^Bearer/, c.what);
    }
    // None of those consumers got a mirror: no delivery was handled.
    const mirror = await a.core
      .readNamespacedSecret({ namespace: tenant, name: mirrorName(idName) })
      .catch(() => undefined);
    assert.equal(mirror, undefined, 'no refused delivery made the mirror');
  });

  it('mirror-sync handles a delivery signed by its sender as before', async () => {
    const name = w.name('ok');
    const consumer = await w.create(fx.consumer(name, fx.inNamespace(tenant), fx.identityRef(idName)));
    const r = await deliver('mirror-sync', eventAbout(name), `Bearer ${token.good}`);
    assert.equal(r.status, 200, r.text);
    const mirror = await a.core.readNamespacedSecret({ namespace: tenant, name: mirrorName(idName) });
    assert.ok(mirror.metadata?.ownerReferences?.some((o) => o.uid === consumer.metadata.uid));
  });

  it("identity-status: its sender's token in, mirror-sync's audience and a stranger out; a verified token is reviewed once while cached", async () => {
    const stranger = await mint('stranger', STATUS_AUDIENCE);
    let from = seen.length;
    assertRefused(
      await deliver('identity-status', pingEvent('status'), `Bearer ${token.good}`),
      401,
      seen.slice(from),
      "mirror-sync's audience",
    );
    from = seen.length;
    assertRefused(
      await deliver('identity-status', pingEvent('status'), `Bearer ${stranger}`),
      403,
      seen.slice(from),
      'a stranger',
    );
    from = seen.length;
    const first = await deliver('identity-status', pingEvent('status'), `Bearer ${token.statusGood}`);
    assert.equal(first.status, 200, first.text);
    assert.equal(seen.slice(from).filter(isTokenReview).length, 1, 'the first delivery is reviewed');
    from = seen.length;
    const again = await deliver('identity-status', pingEvent('status'), `Bearer ${token.statusGood}`);
    assert.equal(again.status, 200, again.text);
    assert.equal(seen.slice(from).filter(isTokenReview).length, 0, 'the same token is not reviewed again while cached');
    // A new token arriving on many deliveries at once (a cold start, a renewal) is reviewed once.
    const fresh = await mint('trigger', STATUS_AUDIENCE);
    from = seen.length;
    const burst = await Promise.all(
      Array.from({ length: 8 }, () => deliver('identity-status', pingEvent('status'), `Bearer ${fresh}`)),
    );
    assert.deepEqual(
      burst.map((r) => r.status),
      Array(8).fill(200),
    );
    assert.equal(seen.slice(from).filter(isTokenReview).length, 1, 'concurrent deliveries share one review');
  });

  it('a TokenReview that cannot be made is a 503 Knative retries, with nothing of the server in it', async () => {
    const said = sentinel();
    fault = (method, path) =>
      method === 'POST' && isTokenReview(path) ? { status: 500, reason: 'InternalError', message: said } : undefined;
    try {
      const from = seen.length;
      const r = await deliver('mirror-sync', eventAbout(w.name('x')), `Bearer ${token.good}`);
      assert.equal(r.status, 503, r.text);
      assert.ok(seen.slice(from).every(isTokenReview), 'nothing else was asked');
      assertNoSecret(r.text, [said], 'the 503');
      assertNoSecret(logs['mirror-sync'].lines.join('\n'), [said], "mirror-sync's log");
    } finally {
      fault = () => undefined;
    }
  });

  it('refusals are logged without the token, naming a ServiceAccount sender, under the id each answer carried', () => {
    const refused = [...logs['mirror-sync'].lines, ...logs['identity-status'].lines].filter((l) =>
      l.includes('event refused'),
    );
    assert.ok(refusalIds.length > 0);
    for (const id of refusalIds)
      assert.ok(
        /^[0-9a-f-]{36}$/.test(id) && refused.some((l) => l.includes(`"requestId":"${id}"`)),
        `a refusal's log line under ${id}`,
      );
    assert.ok(refused.some((l) => l.includes('no-token')));
    assert.ok(refused.some((l) => l.includes(`system:serviceaccount:${senders}:stranger`)));
  });

  it('with the check off a function says so at start and takes unsigned deliveries', async () => {
    const log = captureLogger('identity-status');
    const fn = await startIdentityStatus({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: a.kc,
      logger: log.logger,
      env: { CAPTF_EVENT_AUTH: 'off' },
    });
    w.onCleanup(() => fn.close());
    assert.ok(
      log.lines.some((l) => l.includes('event senders unchecked') && l.includes('"warn"')),
      log.lines.join('\n'),
    );
    const r = await postEvents(`http://127.0.0.1:${fn.port}/`, pingEvent('status'));
    assert.equal(r.status, 200, r.text);
  });

  it('a function told to check senders without saying whom refuses to start, naming the setting', async () => {
    await assert.rejects(
      startMirrorSync({ port: 0, host: '127.0.0.1', kubeconfig: a.kc, logger: captureLogger('x').logger, env: {} }),
      /CAPTF_EVENT_AUDIENCE/,
    );
  });
});

describe('senders beyond the Triggers, and what strangers cost (SPEC §12)', () => {
  it('an EventPolicy naming the function lets a sender in once Ready, and cuts it off when narrowed', async () => {
    await installEventingCRDs(a.kc);
    const stranger = `system:serviceaccount:${senders}:stranger`;
    const policies = eventPolicies(mirrorSyncHome);
    const name = w.name('policy');
    /** The policy's resolved senders and readiness, as Eventing's EventPolicy reconciler writes them. */
    const resolve = (from: string[], ready: 'True' | 'False') =>
      a.custom.patchNamespacedCustomObjectStatus(
        { ...policies, name, body: { status: { from, conditions: [{ type: 'Ready', status: ready }] } } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
    const created = await a.custom.createNamespacedCustomObject({
      ...policies,
      body: eventPolicy(name, 'captf-mirror-sync', [stranger]),
    });
    w.onCleanup(() => a.custom.deleteNamespacedCustomObject({ ...policies, name }).then(() => undefined));
    assert.ok(created);
    const status = async () =>
      (await deliver('mirror-sync', eventAbout(w.name('p')), `Bearer ${token.stranger}`)).status;
    // Not resolved yet: nobody is let in.
    assert.equal(await status(), 403, 'a policy not Ready lets nobody in');
    await resolve([stranger], 'True');
    await eventually('the Ready policy to let the stranger in', async () => (await status()) === 200, 20_000);
    await resolve([`system:serviceaccount:${senders}:someone-else`], 'True');
    await eventually('the narrowed policy to cut the stranger off', async () => (await status()) === 403, 20_000);
    const lists = seen.filter(isPolicyList).length;
    assert.ok(lists >= 1, 'the policies were read');
  });

  it('a flood of distinct forged tokens costs one review each, a few at once, and what cannot wait is a 503 at no cost', async () => {
    let holding = 0;
    let most = 0;
    fault = async (method, path) => {
      if (method !== 'POST' || !isTokenReview(path)) return undefined;
      holding++;
      most = Math.max(most, holding);
      await new Promise((r) => setTimeout(r, 300));
      holding--;
      return undefined;
    };
    const flood = async (count: number) => {
      const from = seen.length;
      const answers = await Promise.all(
        Array.from({ length: count }, (_, i) =>
          deliver(
            'mirror-sync',
            eventAbout(w.name('f')),
            `Bearer ${forged(MIRROR_SYNC_AUDIENCE, `system:serviceaccount:${senders}:f${i}-${from}`)}`,
          ),
        ),
      );
      return { statuses: answers.map((r) => r.status), reviews: seen.slice(from).filter(isTokenReview).length };
    };
    try {
      const few = await flood(3 * MAX_REVIEWS_IN_FLIGHT);
      assert.deepEqual(new Set(few.statuses), new Set([401]));
      assert.equal(few.reviews, 3 * MAX_REVIEWS_IN_FLIGHT);
      assert.ok(most <= MAX_REVIEWS_IN_FLIGHT, `${most} TokenReviews at once`);
      // More than may wait: the rest are told to come back, and cost the API server nothing.
      const many = await flood(MAX_REVIEWS_IN_FLIGHT + MAX_REVIEWS_WAITING + 32);
      const busy = many.statuses.filter((s) => s === 503).length;
      assert.deepEqual(
        many.statuses.filter((s) => s !== 401 && s !== 503),
        [],
      );
      assert.ok(busy > 0, 'some deliveries found the queue full');
      assert.equal(many.reviews + busy, many.statuses.length, 'a 503 made no TokenReview');
      assert.ok(most <= MAX_REVIEWS_IN_FLIGHT, `${most} TokenReviews at once`);
    } finally {
      fault = () => undefined;
    }
  });
});
