/**
 * SPEC §5, through the real API server: `POST /prepare` authenticates (TokenReview with the
 * audience `captf-mirror-sync`) and authorizes (SubjectAccessReview on `<plural>/prepare`)
 * its caller before anything else. Every caller that is refused gets the same answer for an
 * object that exists and one that does not, and mirror-sync reads nothing about the object
 * for it (every API request it makes goes through a recording proxy). A review that cannot be
 * made is a 503 that says nothing the server said; the review cache reuses a result for at
 * most its TTL; no token appears in any log line or answer.
 */
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import { freePort } from '../../scripts/lib/ports.ts';
import { serviceAccountToken, type PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { controlPlaneDir, suffix } from '../helpers/cluster.ts';
import { startFaultProxy, type Fault, type FaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import { UNSIGNED_EVENTS } from '../helpers/events.ts';
import {
  MANAGER_SERVICE_ACCOUNT,
  manager,
  postPrepare,
  prepareTarget,
  type PrepareAnswer,
} from '../helpers/prepare.ts';

const w = fx.world('pauth');
const a = w.clients;
const log = captureLogger('mirror-sync');
const SECRET = sentinel();
/** Planted in every injected fault's message: it must reach no answer and no log line. */
const SERVER_TEXT = sentinel();
const answers: string[] = [];
const tokens: string[] = [];
/** `METHOD path` of every API request mirror-sync made through the proxy. */
const seen: string[] = [];
let fault: (method: string, url: string) => Fault | undefined = () => undefined;
let proxy: FaultProxy;
let proxyKc: KubeConfig;
const running: FunctionHandle[] = [];
let url: string;
let tenant: string;
let idName: string;
let caller: PrepareCaller;
/** Callers that must be refused; `headerOnly` when the header alone decides (no TokenReview). */
const refused: { what: string; authorization: string | undefined; status: 401 | 403; headerOnly?: true }[] = [];

const target = (name: string) => prepareTarget(fx.consumer(name, fx.inNamespace(tenant)));
const isReview = (r: string) => /\/(tokenreviews|subjectaccessreviews)(\?|$)/.test(r);

/** mirror-sync in-process, its API requests through the recording proxy (or `kc`). */
async function startMirrorSync(env: NodeJS.ProcessEnv = {}, kc = proxyKc): Promise<string> {
  const fn = await start({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: kc,
    logger: log.logger,
    env: { ...UNSIGNED_EVENTS, ...env },
  });
  running.push(fn);
  return `http://127.0.0.1:${fn.port}`;
}

/** POST /prepare, remembering the answer for the leak scans. */
async function prepare(base: string, body: unknown, auth: PrepareCaller | string | undefined): Promise<PrepareAnswer> {
  const r = await postPrepare(base, body, auth);
  answers.push(r.text, r.headers.get('www-authenticate') ?? '');
  return r;
}

before(async () => {
  const operator = await w.namespace();
  await w.create(fx.sourceSecret('creds', fx.inNamespace(operator), fx.data({ token: SECRET })));
  tenant = await w.namespace();
  idName = w.name('id');
  await w.create(fx.identity(idName, fx.secretRef(operator, 'creds'), fx.allowList(tenant)));
  await w.create(fx.consumer('present', fx.inNamespace(tenant), fx.identityRef(idName)));
  proxy = await startFaultProxy((method, u) => {
    seen.push(`${method} ${u}`);
    return fault(method, u);
  });
  proxyKc = new KubeConfig();
  proxyKc.loadFromFile(proxy.kubeconfigPath);
  url = await startMirrorSync({ CAPTF_PREPARE_AUTH_CACHE_SECONDS: '0' });
  caller = await manager(w);
  await refusedCallers();
});
after(async () => {
  for (const f of running) await f.close();
  proxy?.close();
  const said = [...log.lines, ...answers].join('\n');
  assertNoSecret(said, [SECRET, SERVER_TEXT, ...tokens, ...(caller ? [caller.token] : [])], 'logs and answers');
});

/** The callers that must be refused, with a token each where it has one. */
async function refusedCallers(): Promise<void> {
  const managerNs = caller.user.split(':')[2]!;
  const defaultAudience = await serviceAccountToken(a.kc, { namespace: managerNs, name: MANAGER_SERVICE_ACCOUNT });
  const otherAudience = await serviceAccountToken(a.kc, {
    namespace: managerNs,
    name: MANAGER_SERVICE_ACCOUNT,
    audience: 'someone-else',
  });
  const strangerNs = await w.namespace();
  await a.core.createNamespacedServiceAccount({ namespace: strangerNs, body: { metadata: { name: 'stranger' } } });
  const stranger = await serviceAccountToken(a.kc, {
    namespace: strangerNs,
    name: 'stranger',
    audience: 'captf-mirror-sync',
  });
  tokens.push(defaultAudience, otherAudience, stranger);
  refused.push(
    { what: 'no Authorization header', authorization: undefined, status: 401, headerOnly: true },
    { what: 'another scheme', authorization: 'Basic dXNlcjpwYXNz', status: 401, headerOnly: true },
    { what: 'Bearer without a token', authorization: 'Bearer', status: 401, headerOnly: true },
    { what: 'two words after Bearer', authorization: `Bearer ${caller.token} extra`, status: 401, headerOnly: true },
    { what: 'a token with a forbidden character', authorization: 'Bearer abc,def', status: 401, headerOnly: true },
    { what: 'a garbage token', authorization: 'Bearer bm90LWEtdG9rZW4', status: 401 },
    { what: "a token for the API server's own audience", authorization: `Bearer ${defaultAudience}`, status: 401 },
    { what: 'a token for another audience', authorization: `Bearer ${otherAudience}`, status: 401 },
    {
      what: 'a valid token of a user without the prepare permission',
      authorization: `Bearer ${stranger}`,
      status: 403,
    },
  );
}

describe('prepare authenticates and authorizes its caller first (SPEC §5)', () => {
  it('every refused caller gets the same answer for an existing and a missing object, and nothing about either is read', async () => {
    for (const c of refused) {
      const from = seen.length;
      const present = await prepare(url, target('present'), c.authorization);
      const absent = await prepare(url, target(`absent-${suffix()}`), c.authorization);
      assert.equal(present.status, c.status, `${c.what}: ${present.text}`);
      assert.equal(absent.status, c.status, `${c.what}: ${absent.text}`);
      assert.equal(present.text, absent.text, `${c.what}: one answer whether the object exists or not`);
      assert.equal(present.body.reason, c.status === 401 ? 'Unauthorized' : 'Forbidden', c.what);
      if (c.status === 401)
        assert.match(present.headers.get('www-authenticate') ?? '', /^Bearer realm="captf-mirror-sync"/);
      const reads = seen.slice(from).filter((r) => !isReview(r));
      assert.deepEqual(reads, [], `${c.what}: only reviews, nothing about the object`);
      if (c.headerOnly) assert.deepEqual(seen.slice(from), [], `${c.what}: decided from the header alone`);
    }
  });

  it('the manager gets 200 for an existing object, and 404 for an absent one only after it is authorized', async () => {
    const ok = await prepare(url, target('present'), caller);
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.mirror, mirrorName(idName));
    const missing = await prepare(url, target(`absent-${suffix()}`), caller);
    assert.equal(missing.status, 404, missing.text);
    assert.equal(missing.body.reason, 'ObjectNotFound');
  });

  it('after authentication a malformed body is a 400 naming what is wrong; an unknown kind is about configuration', async () => {
    const bad = await prepare(url, { ...target('present'), name: undefined }, caller); // no name
    assert.equal(bad.status, 400);
    assert.match(bad.body.error!, /field name/);
    const unknown = await prepare(url, { apiVersion: 'v1', kind: 'Pod', namespace: tenant, name: 'x' }, caller);
    assert.equal(unknown.status, 400);
    assert.equal(unknown.body.reason, 'UnknownKind');
    const unauthenticated = await prepare(url, 'not json', undefined);
    assert.equal(unauthenticated.status, 401, 'no token: the body is never looked at');
  });

  it('a missing header is refused before the body is read (the body never finishes arriving)', async () => {
    const { port } = new URL(url);
    const status = await new Promise<number>((resolve, reject) => {
      const req = request(
        { host: '127.0.0.1', port, path: '/prepare', method: 'POST', headers: { 'content-length': '100000' } },
        (res) => {
          resolve(res.statusCode ?? 0);
          res.resume();
          req.destroy();
        },
      );
      req.on('error', reject);
      req.write('{"apiVersion":');
    });
    assert.equal(status, 401);
  });
});

describe('a review that cannot be made is a 503, never 401, 403 or 200 (SPEC §5)', () => {
  const serverFault = (status: number): Fault => ({
    status,
    reason: status === 429 ? 'TooManyRequests' : 'InternalError',
    message: `the server says ${SERVER_TEXT}`,
  });
  for (const [review, status] of [
    ['tokenreviews', 500],
    ['tokenreviews', 429],
    ['subjectaccessreviews', 500],
    ['subjectaccessreviews', 503],
  ] as const) {
    it(`${review} answering ${status}`, async () => {
      fault = (_m, u) => (u.includes(`/${review}`) ? serverFault(status) : undefined);
      try {
        for (const name of ['present', `absent-${suffix()}`]) {
          const r = await prepare(url, target(name), caller);
          assert.equal(r.status, 503, r.text);
          assert.equal(r.body.reason, 'AuthorizationUnavailable');
          assert.match(r.body.error!, new RegExp(`HTTP ${status}`));
        }
      } finally {
        fault = () => undefined;
      }
    });
  }

  it('the API server unreachable (a closed port)', async () => {
    const text = readFileSync(join(controlPlaneDir(), 'admin.kubeconfig'), 'utf8').replace(
      new URL(a.kc.getCurrentCluster()!.server).origin,
      `https://127.0.0.1:${await freePort()}`,
    );
    const path = join(controlPlaneDir(), 'users', `closed-${suffix()}.kubeconfig`);
    writeFileSync(path, text, { mode: 0o600 });
    const kc = new KubeConfig();
    kc.loadFromFile(path);
    const closed = await startMirrorSync({}, kc);
    const r = await prepare(closed, target('present'), caller);
    assert.equal(r.status, 503, r.text);
    assert.match(r.body.error!, /TokenReview failed \(transport error .*: ECONNREFUSED\)/);
  });
});

describe('the review cache (SPEC §5: at most 10 s, keyed by hashes)', () => {
  it('reuses a TokenReview and a SubjectAccessReview within its TTL, and asks again after it', async () => {
    // Long enough that three prepares on a loaded machine fit in it.
    const cached = await startMirrorSync({ CAPTF_PREPARE_AUTH_CACHE_SECONDS: '5' });
    const reviews = async (name: string) => {
      const from = seen.length;
      assert.equal((await prepare(cached, target(name), caller)).status, name === 'present' ? 200 : 404);
      return seen
        .slice(from)
        .filter(isReview)
        .map((r) => /\/(\w+)(\?|$)/.exec(r.split(' ')[1]!)![1]);
    };
    assert.deepEqual(await reviews('present'), ['tokenreviews', 'subjectaccessreviews']);
    assert.deepEqual(await reviews('present'), [], 'both answers reused');
    assert.deepEqual(await reviews('absent-x'), ['subjectaccessreviews'], 'another object: only the SAR');
    await new Promise((r) => setTimeout(r, 5100));
    assert.deepEqual(await reviews('present'), ['tokenreviews', 'subjectaccessreviews'], 'expired after 5 s');
  });
});
