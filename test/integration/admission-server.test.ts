/**
 * The admission server itself: malformed reviews posted directly, the body limit, serving
 * certificate rotation without a restart, plain-HTTP mode, the caller check by client
 * certificate, and the start-up time of the real entrypoint (process start → first answered
 * AdmissionReview).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { connect as tlsConnect } from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node';
import { CALLER_REFUSED } from '../../functions/admission/callers.ts';
import { start } from '../../functions/admission/index.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { REPO_ROOT } from '../../scripts/tools/build.ts';
import { freePort } from '../../scripts/lib/ports.ts';
import { createCA, createLeaf, type CertPair } from '../../scripts/controlplane/pki.ts';
import { asUser, controlPlaneDir, eventually, suffix } from '../helpers/cluster.ts';
import { assertNoSecret, captureLogger, sentinel } from '../helpers/logs.ts';
import * as fx from '../helpers/fixtures.ts';

interface Answer {
  status: number;
  text: string;
  json: () => Record<string, unknown>;
}

/**
 * One request on a fresh connection (so a rotated certificate is seen), trusting `ca`, and
 * presenting `client`'s certificate when given.
 */
function call(
  url: string,
  opts: { method?: string; body?: string | Buffer; ca?: string; client?: CertPair } = {},
): Promise<Answer> {
  return new Promise((res, rej) => {
    const u = new URL(url);
    const req = (u.protocol === 'https:' ? httpsRequest : httpRequest)(
      u,
      {
        method: opts.method ?? (opts.body === undefined ? 'GET' : 'POST'),
        agent: false,
        ...(opts.ca ? { ca: opts.ca } : {}),
        ...(opts.client ? { cert: readFileSync(opts.client.cert), key: readFileSync(opts.client.key) } : {}),
        headers:
          opts.body === undefined
            ? {}
            : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(opts.body) },
      },
      (resp) => {
        const chunks: Buffer[] = [];
        resp.on('data', (c: Buffer) => chunks.push(c));
        resp.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          res({ status: resp.statusCode ?? 0, text, json: () => JSON.parse(text) as Record<string, unknown> });
        });
      },
    );
    // The server may answer 413 and close before a huge body is fully written; the answer
    // still arrives, so a write error after it is not a failure.
    req.on('error', rej);
    req.end(opts.body);
  });
}

const review = (request: unknown, over: Record<string, unknown> = {}) =>
  JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request, ...over });
/** A well-formed metadata-only UPDATE review: needs no API call, so it is answered from the decisions alone. */
const goodRequest = (uid: string) => {
  const obj = fx.identity('x');
  return {
    uid,
    operation: 'UPDATE',
    name: 'x',
    userInfo: { username: 'alice', groups: ['g'] },
    object: { ...obj, metadata: { name: 'x', labels: { a: 'b' } } },
    oldObject: obj,
  };
};

let pki: string;
let ca1: CertPair;
let leaf1: CertPair;
let ca2: CertPair;
let leaf2: CertPair;

after(() => rmSync(pki, { recursive: true, force: true }));

before(async () => {
  pki = mkdtempSync(join(tmpdir(), 'captf-adm-srv-'));
  [ca1, ca2] = await Promise.all([
    createCA(pki, 'ca1', `captf-test-ca1-${suffix()}`),
    createCA(pki, 'ca2', `captf-test-ca2-${suffix()}`),
  ]);
  [leaf1, leaf2] = await Promise.all([
    createLeaf({ ca: ca1, dir: pki, name: 'leaf1', cn: 'captf-admission', sans: ['IP:127.0.0.1'], usage: 'server' }),
    createLeaf({ ca: ca2, dir: pki, name: 'leaf2', cn: 'captf-admission', sans: ['IP:127.0.0.1'], usage: 'server' }),
  ]);
});

const adminKubeConfig = () => {
  const kc = new KubeConfig();
  kc.loadFromFile(join(controlPlaneDir(), 'admin.kubeconfig'));
  return kc;
};

describe('malformed AdmissionReviews posted directly get a clear 400 or denial, and the server keeps serving', () => {
  const cap = captureLogger('admission');
  const planted = sentinel();
  let fn: FunctionHandle;
  let url: string;
  let ca: string;
  before(async () => {
    fn = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: adminKubeConfig(),
      logger: cap.logger,
      env: { CAPTF_TLS_CERT_FILE: leaf1.cert, CAPTF_TLS_KEY_FILE: leaf1.key },
    });
    url = `https://127.0.0.1:${fn.port}`;
    ca = readFileSync(ca1.cert, 'utf8');
  });
  after(() => fn.close());

  const stillServing = async () => {
    assert.equal((await call(`${url}/healthz`, { ca })).status, 200);
    const ok = await call(`${url}/validate`, { ca, body: review(goodRequest('still-ok')) });
    assert.equal(ok.status, 200);
    assert.deepEqual(ok.json().response, { uid: 'still-ok', allowed: true });
  };

  const rows: [string, string | Buffer, number, RegExp][] = [
    ['not JSON', `{"not json ${planted}`, 400, /not JSON/],
    [
      'wrong apiVersion',
      review(goodRequest('u1'), { apiVersion: 'admission.k8s.io/v1beta1' }),
      400,
      /expected apiVersion admission\.k8s\.io\/v1/,
    ],
    ['missing request', review(undefined), 400, /no request/],
    ['missing uid', review({ ...goodRequest('x'), uid: undefined }), 400, /no uid/],
    ['a 10 MB body', Buffer.alloc(10 * 1024 * 1024, 'a'), 413, /too large/],
  ];
  for (const [what, body, status, message] of rows) {
    it(`${what} → ${status}`, async () => {
      const r = await call(`${url}/validate`, { ca, body });
      assert.equal(r.status, status);
      assert.match(String(r.json().error), message);
      assertNoSecret(r.text, [planted], 'the 400 answer');
      await stillServing();
    });
  }

  it('missing userInfo → a denial that echoes the uid', async () => {
    const r = await call(`${url}/validate`, { ca, body: review({ ...goodRequest('no-user'), userInfo: undefined }) });
    assert.equal(r.status, 200);
    const resp = r.json().response as { uid: string; allowed: boolean; status: { message: string } };
    assert.equal(resp.uid, 'no-user');
    assert.equal(resp.allowed, false);
    assert.match(resp.status.message, /malformed AdmissionReview, denied: request\.userInfo is missing/);
    await stillServing();
  });

  it('allowedNamespaces: {} is denied by the webhook itself (the CRD rule stops it earlier through the API server)', async () => {
    for (const [uid, operation] of [
      ['empty-create', 'CREATE'],
      ['empty-update', 'UPDATE'],
    ] as const) {
      const g = goodRequest(uid);
      const object = { ...g.object, spec: { ...g.object.spec, allowedNamespaces: {} } };
      const r = await call(`${url}/validate`, {
        ca,
        body: review({ ...g, operation, object, ...(operation === 'CREATE' ? { oldObject: undefined } : {}) }),
      });
      const resp = r.json().response as { uid: string; allowed: boolean; status: { code: number; message: string } };
      assert.equal(resp.uid, uid);
      assert.equal(resp.allowed, false);
      assert.equal(resp.status.code, 422);
      assert.match(resp.status.message, /spec\.allowedNamespaces: \{\} is ambiguous/);
    }
  });

  it('a failing SubjectAccessReview or consumer lookup denies (fail closed): the API user may do neither', async () => {
    const kc = new KubeConfig();
    kc.loadFromFile((await asUser(`no-rbac-${suffix()}`)).kubeconfigPath);
    const weak = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: kc,
      logger: cap.logger,
      env: { CAPTF_TLS_CERT_FILE: leaf1.cert, CAPTF_TLS_KEY_FILE: leaf1.key },
    });
    try {
      const wurl = `https://127.0.0.1:${weak.port}/validate`;
      const created = await call(wurl, {
        ca,
        body: review({ ...goodRequest('sar-fails'), operation: 'CREATE', oldObject: undefined }),
      });
      const c = created.json().response as { uid: string; allowed: boolean; status: { code: number; message: string } };
      assert.equal(c.uid, 'sar-fails');
      assert.equal(c.allowed, false);
      assert.match(
        c.status.message,
        /could not check whether user "alice" may get Secret captf-system\/creds \(SubjectAccessReview failed: HTTP 403/,
      );
      const deleted = await call(wurl, {
        ca,
        body: review({ ...goodRequest('lookup-fails'), operation: 'DELETE', object: undefined }),
      });
      const d = deleted.json().response as { allowed: boolean; status: { message: string } };
      assert.equal(d.allowed, false);
      assert.match(d.status.message, /consumer lookup failed: HTTP 403/);
    } finally {
      await weak.close();
    }
  });

  it('logs carry no planted value', () => {
    assertNoSecret(cap.lines.join('\n'), [planted], 'admission logs');
  });
});

describe('serving certificate rotation without a restart', () => {
  it('new connections get the new pair once the files change; a mismatched pair is skipped', async () => {
    const cap = captureLogger('admission');
    // Inside the file's PKI folder, which goes after the file.
    const dir = mkdtempSync(join(pki, 'rot-'));
    const cert = join(dir, 'tls.crt');
    const key = join(dir, 'tls.key');
    copyFileSync(leaf1.cert, cert);
    copyFileSync(leaf1.key, key);
    const fn = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: adminKubeConfig(),
      logger: cap.logger,
      env: { CAPTF_TLS_CERT_FILE: cert, CAPTF_TLS_KEY_FILE: key, CAPTF_TLS_RELOAD_MS: '100' },
    });
    const url = `https://127.0.0.1:${fn.port}/healthz`;
    const trust1 = readFileSync(ca1.cert, 'utf8');
    const trust2 = readFileSync(ca2.cert, 'utf8');
    try {
      assert.equal((await call(url, { ca: trust1 })).status, 200);
      await assert.rejects(
        call(url, { ca: trust2 }),
        /certificate/i,
        'a client trusting only CA 2 refuses the first pair',
      );

      // A half-done rotation (new certificate, old key) is not installed; the old pair keeps serving.
      copyFileSync(leaf2.cert, cert);
      await eventually(
        'the mismatched pair to be noticed',
        async () => cap.lines.some((l) => l.includes('not usable yet')),
        10_000,
      );
      assert.equal((await call(url, { ca: trust1 })).status, 200);

      copyFileSync(leaf2.key, key);
      await eventually(
        'new connections to see the certificate of CA 2',
        async () => (await call(url, { ca: trust2 })).status === 200,
        10_000,
      );
      await assert.rejects(call(url, { ca: trust1 }), /certificate/i, 'the old pair is no longer served');
      assert.ok(cap.lines.some((l) => l.includes('TLS certificate reloaded')));
    } finally {
      await fn.close();
    }
  });
});

describe("with a client CA, only a caller presenting that CA's certificate gets a review", () => {
  const cap = captureLogger('admission');
  let dir: string;
  let caFile: string;
  let trust: string;
  let apiServer: CertPair;
  let intruder: CertPair;
  let stranger: CertPair;
  let strangerCa: CertPair;
  const started: FunctionHandle[] = [];
  before(async () => {
    dir = mkdtempSync(join(pki, 'callers-'));
    const [clientCa, otherCa] = await Promise.all([
      createCA(dir, 'client-ca', `captf-test-client-ca-${suffix()}`),
      createCA(dir, 'other-ca', `captf-test-other-ca-${suffix()}`),
    ]);
    strangerCa = otherCa;
    const client = (ca: CertPair, name: string, cn: string) => createLeaf({ ca, dir, name, cn, usage: 'client' });
    [apiServer, intruder, stranger] = await Promise.all([
      client(clientCa, 'apiserver', 'kube-apiserver-webhook-client'),
      client(clientCa, 'intruder', 'intruder'),
      client(otherCa, 'stranger', 'kube-apiserver-webhook-client'),
    ]);
    caFile = join(dir, 'ca.crt');
    copyFileSync(clientCa.cert, caFile);
    trust = readFileSync(ca1.cert, 'utf8');
  });
  after(() => Promise.all(started.map((f) => f.close())));

  const startChecking = async (env: Record<string, string> = {}) => {
    const fn = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: adminKubeConfig(),
      logger: cap.logger,
      env: {
        CAPTF_TLS_CERT_FILE: leaf1.cert,
        CAPTF_TLS_KEY_FILE: leaf1.key,
        CAPTF_ADMISSION_CLIENT_CA_FILE: caFile,
        ...env,
      },
    });
    started.push(fn);
    return `https://127.0.0.1:${fn.port}`;
  };
  /** A CREATE: answering it would take a SubjectAccessReview. */
  const create = (uid: string) => review({ ...goodRequest(uid), operation: 'CREATE', oldObject: undefined });
  const refusals = (reason: string) =>
    cap.lines.filter((l) => l.includes('admission caller refused') && l.includes(`"reason":"${reason}"`)).length;
  const reviewed = (uid: string) => cap.lines.some((l) => l.includes('"reviewed"') && l.includes(uid));

  it("no certificate and another CA's certificate: 403, one fixed sentence, no review made; the health check stays open", async () => {
    const url = await startChecking();
    for (const [client, reason, uid] of [
      [undefined, 'no client certificate', 'no-cert'],
      [stranger, 'not signed by the client CA', 'other-ca'],
    ] as const) {
      const before = refusals(reason);
      const r = await call(`${url}/validate`, { ca: trust, body: create(uid), ...(client ? { client } : {}) });
      assert.equal(r.status, 403, uid);
      assert.deepEqual(r.json(), { error: CALLER_REFUSED });
      assert.equal(refusals(reason), before + 1, `one log line saying why (${reason})`);
      assert.ok(!reviewed(uid), `no review was made for ${uid}`);
    }
    assert.equal((await call(`${url}/healthz`, { ca: trust })).status, 200);
    const ok = await call(`${url}/validate`, { ca: trust, client: apiServer, body: create('api-server') });
    assert.equal(ok.status, 200);
    assert.equal((ok.json().response as { uid: string }).uid, 'api-server');
    assert.ok(reviewed('api-server'));
  });

  it('with CAPTF_ADMISSION_CLIENT_NAMES, a certificate of the right CA with another subject is refused', async () => {
    const url = await startChecking({ CAPTF_ADMISSION_CLIENT_NAMES: 'kube-apiserver-webhook-client' });
    const before = refusals('subject not allowed');
    const r = await call(`${url}/validate`, { ca: trust, client: intruder, body: review(goodRequest('intruder')) });
    assert.equal(r.status, 403);
    assert.equal(refusals('subject not allowed'), before + 1);
    const ok = await call(`${url}/validate`, { ca: trust, client: apiServer, body: review(goodRequest('named')) });
    assert.deepEqual(ok.json().response, { uid: 'named', allowed: true });
  });

  it('a new CA in the file is trusted without a restart, and the old one no longer', async () => {
    const rotating = join(dir, 'rotating-ca.crt');
    copyFileSync(caFile, rotating);
    const url = await startChecking({ CAPTF_ADMISSION_CLIENT_CA_FILE: rotating, CAPTF_TLS_RELOAD_MS: '100' });
    const status = async (client: CertPair) =>
      (await call(`${url}/validate`, { ca: trust, client, body: review(goodRequest('rot')) })).status;
    assert.equal(await status(apiServer), 200);
    assert.equal(await status(stranger), 403);
    copyFileSync(strangerCa.cert, rotating);
    await eventually('the new CA to be trusted', async () => (await status(stranger)) === 200, 10_000);
    assert.equal(await status(apiServer), 403, 'the old CA is no longer trusted');
  });

  it("a TLS 1.2 renegotiation is refused: Node would keep the first handshake's verdict for the next certificate", async () => {
    const url = new URL(await startChecking());
    const socket = tlsConnect({
      host: '127.0.0.1',
      port: Number(url.port),
      ca: trust,
      maxVersion: 'TLSv1.2',
      cert: readFileSync(apiServer.cert),
      key: readFileSync(apiServer.key),
    });
    socket.on('error', () => undefined);
    await new Promise<void>((res, rej) => {
      socket.once('secureConnect', res);
      socket.once('error', rej);
    });
    try {
      const outcome = await new Promise<string>((res) => {
        const asked = socket.renegotiate({ rejectUnauthorized: false }, (err) => res(err ? 'refused' : 'renegotiated'));
        if (!asked) res('refused');
        socket.once('close', () => res('refused'));
      });
      assert.equal(outcome, 'refused');
    } finally {
      socket.destroy();
    }
  });

  it('a CA file that holds no CA certificate stops the start, naming it', async () => {
    const leafOnly = join(dir, 'leaf-only-ca.crt');
    copyFileSync(apiServer.cert, leafOnly);
    await assert.rejects(startChecking({ CAPTF_ADMISSION_CLIENT_CA_FILE: leafOnly }), /holds no CA certificate/);
    const empty = join(dir, 'empty-ca.crt');
    copyFileSync(leaf1.key, empty);
    await assert.rejects(
      startChecking({ CAPTF_ADMISSION_CLIENT_CA_FILE: empty }),
      /client CA bundle .*holds no PEM certificate/,
    );
  });
});

describe('plain-HTTP mode (behind a TLS-terminating ingress)', () => {
  it('serves reviews over HTTP when CAPTF_ADMISSION_PLAIN_HTTP=true, without any certificate files', async () => {
    const fn = await start({
      port: 0,
      host: '127.0.0.1',
      kubeconfig: adminKubeConfig(),
      logger: captureLogger('admission').logger,
      env: { CAPTF_ADMISSION_PLAIN_HTTP: 'true', CAPTF_TLS_CERT_FILE: '/nonexistent/tls.crt' },
    });
    try {
      assert.equal(fn.scheme, 'http');
      const r = await call(`http://127.0.0.1:${fn.port}/validate`, { body: review(goodRequest('plain')) });
      assert.deepEqual(r.json().response, { uid: 'plain', allowed: true });
    } finally {
      await fn.close();
    }
  });

  it('refuses to start over HTTPS when the certificate file is missing, naming it', async () => {
    await assert.rejects(
      start({
        port: 0,
        host: '127.0.0.1',
        kubeconfig: adminKubeConfig(),
        logger: captureLogger('admission').logger,
        env: { CAPTF_TLS_CERT_FILE: '/nonexistent/tls.crt', CAPTF_TLS_KEY_FILE: leaf1.key },
      }),
      /cannot read the TLS certificate \/nonexistent\/tls\.crt/,
    );
  });
});

describe('start-up of the real entrypoint', () => {
  // Measured, not asserted (beyond a generous bound): the figure goes in the report/README.
  for (const [how, cmd, args] of [
    ['node functions/main.ts admission', process.execPath, ['functions/main.ts', 'admission']],
    ['npx node functions/main.ts admission', 'npx', ['node', 'functions/main.ts', 'admission']],
  ] as const) {
    it(`${how}: process start → first answered AdmissionReview (a CREATE with a real SubjectAccessReview)`, async (t) => {
      const port = await freePort();
      const t0 = performance.now();
      const child = spawn(cmd, args, {
        // Its own process group, so SIGTERM reaches the function even under npx's wrappers.
        cwd: REPO_ROOT,
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true,
        env: {
          ...process.env,
          KUBECONFIG: join(controlPlaneDir(), 'admin.kubeconfig'),
          PORT: String(port),
          CAPTF_TLS_CERT_FILE: leaf1.cert,
          CAPTF_TLS_KEY_FILE: leaf1.key,
          LOG_LEVEL: 'info',
        },
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
      });
      child.stderr.on('data', (d: Buffer) => {
        out += d.toString();
      });
      // 'close' fires once every process holding the output pipes (the function itself, also
      // under npx) has exited.
      const closed = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
      try {
        const ca = readFileSync(ca1.cert, 'utf8');
        const body = review({
          ...goodRequest('startup'),
          operation: 'CREATE',
          oldObject: undefined,
          userInfo: { username: 'admin', groups: ['system:masters'] },
        });
        // Poll every 10 ms (not eventually()'s 200 ms) so the figure is not rounded up.
        let answer: Answer | undefined;
        while (!answer && performance.now() - t0 < 30_000 && child.exitCode === null) {
          answer = await call(`https://127.0.0.1:${port}/validate`, { ca, body }).catch(() => undefined);
          if (!answer) await new Promise((r) => setTimeout(r, 10));
        }
        assert.ok(answer, `no answer within 30 s; output:\n${out}`);
        const ms = Math.round(performance.now() - t0);
        assert.deepEqual(answer.json().response, { uid: 'startup', allowed: true }, out);
        const listening = out.split('\n').find((l) => l.includes('"listening"'));
        t.diagnostic(
          `${how}: ${ms} ms from spawn to the first answered AdmissionReview; process reported listening at ${listening ? (JSON.parse(listening) as { startupMs: number }).startupMs : '?'} ms`,
        );
      } finally {
        process.kill(-child.pid!, 'SIGTERM');
        const code = await closed;
        if (cmd === process.execPath) assert.equal(code, 0, `graceful stop on SIGTERM; output:\n${out}`);
        assert.match(out, /"message":"stopped"/, 'the function stopped gracefully');
      }
    });
  }
});
