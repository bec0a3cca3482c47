/**
 * Request bodies on every endpoint of the three functions (functions/lib/http.ts `readBody`):
 * a content type the endpoint does not take is a 415 before anything is read or reviewed; a
 * body over the limit is a 413 at once from `Content-Length`, and a chunked one while it is
 * still being sent, with reading stopped near the limit; on `/prepare` the caller's missing
 * token is answered first (SPEC §5).
 */
import assert from 'node:assert/strict';
import { createServer, request, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { ADMISSION_BODY_LIMIT } from '../../functions/admission/index.ts';
import { BodyBudget } from '../../functions/lib/body-memory.ts';
import {
  closeServer,
  createApp,
  DEFAULT_BODY_LIMIT,
  errorHandler,
  JSON_TYPES,
  limitIdleConnections,
  listen,
  readBody,
  serverOptions,
  type FunctionHandle,
} from '../../functions/lib/http.ts';
import { eventually, sleep } from '../../scripts/lib/wait.ts';
import { captureLogger } from '../helpers/logs.ts';
import { admissionReview, identityRequest } from '../helpers/admission.ts';
import { startInProcess } from '../helpers/process.ts';
import * as fx from '../helpers/fixtures.ts';
import { manager } from '../helpers/prepare.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';

const w = fx.world('bodies');

/** One endpoint: its function, path, limit and a body it would accept as JSON. */
interface Endpoint {
  name: string;
  fn: () => FunctionHandle;
  path: string;
  limit: number;
  body: string;
  headers?: () => Record<string, string>;
}

/** An answer, how many body bytes the client had written when it came, and the server's bytes read. */
interface Sent {
  status: number;
  text: string;
  written: number;
  serverRead: number;
}

/** POSTs `body` to `fn` with `headers`; the server's bytes read are taken when the answer has come. */
async function post(
  fn: FunctionHandle,
  path: string,
  headers: Record<string, string | number>,
  send: { body?: string },
): Promise<Sent> {
  let serverSocket: Socket | undefined;
  fn.server.once('connection', (s: Socket) => (serverSocket = s));
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: fn.port, path, method: 'POST', headers, agent: false }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () =>
        resolve({ status: res.statusCode!, text, written: 0, serverRead: serverSocket?.bytesRead ?? 0 }),
      );
    });
    req.on('error', reject);
    req.end(send.body);
  });
}

/**
 * Streams up to `bytes` of a chunked body in 64 KiB chunks over a raw socket, as fast as the
 * socket takes them, until the server answers or closes; returns the answer, the bytes
 * written by then and the bytes the server had read.
 */
function upload(fn: FunctionHandle, path: string, headers: Record<string, string>, bytes: number): Promise<Sent> {
  let serverSocket: Socket | undefined;
  fn.server.once('connection', (s: Socket) => (serverSocket = s));
  return new Promise((resolve) => {
    const socket = connect(fn.port, '127.0.0.1');
    let text = '';
    let written = 0;
    let writtenAtAnswer = -1;
    const head = Object.entries({ host: 'fn', 'transfer-encoding': 'chunked', ...headers })
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('');
    const chunk = Buffer.concat([Buffer.from('10000\r\n'), Buffer.alloc(0x10000, 'x'), Buffer.from('\r\n')]);
    const pump = () => {
      while (writtenAtAnswer < 0 && written < bytes && !socket.destroyed) {
        written += 0x10000;
        if (!socket.write(chunk)) return void socket.once('drain', pump);
      }
    };
    socket.on('data', (d: Buffer) => {
      if (writtenAtAnswer < 0) writtenAtAnswer = written;
      text += d.toString('latin1');
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
      resolve({
        status,
        text,
        written: writtenAtAnswer < 0 ? written : writtenAtAnswer,
        serverRead: serverSocket?.bytesRead ?? 0,
      });
    });
    socket.write(`POST ${path} HTTP/1.1\r\n${head}\r\n`);
    pump();
  });
}

const review = JSON.stringify(
  admissionReview(identityRequest('UPDATE', fx.identity('aws', fx.labels({ a: 'b' })), fx.identity('aws'))),
);

describe('request bodies on every endpoint', () => {
  let admission: FunctionHandle, mirrorSync: FunctionHandle, identityStatus: FunctionHandle;
  let caller: PrepareCaller;
  const endpoints: Endpoint[] = [];

  before(async () => {
    ({ admission, mirrorSync, identityStatus } = await startInProcess(w.clients.kc));
    caller = await manager(w);
    const event = '{"specversion":"1.0","id":"1","source":"/s","type":"dev.knative.sources.ping"}';
    endpoints.push(
      {
        name: 'admission /validate',
        fn: () => admission,
        path: '/validate',
        limit: ADMISSION_BODY_LIMIT,
        body: review,
      },
      { name: 'mirror-sync /', fn: () => mirrorSync, path: '/', limit: DEFAULT_BODY_LIMIT, body: event },
      {
        name: 'mirror-sync /prepare',
        fn: () => mirrorSync,
        path: '/prepare',
        limit: DEFAULT_BODY_LIMIT,
        body: '{}',
        headers: () => ({ authorization: caller.authorization }),
      },
      { name: 'identity-status /', fn: () => identityStatus, path: '/', limit: DEFAULT_BODY_LIMIT, body: event },
    );
  });
  after(async () => {
    await Promise.all([admission, mirrorSync, identityStatus].map((f) => f?.close()));
  });

  it('a body of a type the endpoint does not take is a 415 naming the types; a valid AdmissionReview as text/plain is not reviewed', async () => {
    for (const e of endpoints) {
      for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'application/json; charset=latin1']) {
        const r = await post(e.fn(), e.path, { 'content-type': type, ...e.headers?.() }, { body: e.body });
        assert.equal(r.status, 415, `${e.name}, ${type}: ${r.text}`);
        assert.match(r.text, /content type must be one of application\/json|charset must be utf-8/, e.name);
        assert.doesNotMatch(r.text, /"allowed"/, `${e.name}: nothing was reviewed`);
      }
      const gzip = await post(
        e.fn(),
        e.path,
        { 'content-type': 'application/json', 'content-encoding': 'gzip', ...e.headers?.() },
        { body: e.body },
      );
      assert.equal(gzip.status, 415, `${e.name}, gzip`);
    }
  });

  it("the accepted types still work, with parameters; an empty body of any type is the handler's to judge", async () => {
    const empty = await post(identityStatus, '/', { 'content-type': 'text/plain' }, { body: '' });
    assert.notEqual(empty.status, 415, empty.text);
    const ok = await post(
      admission,
      '/validate',
      { 'content-type': 'application/json; charset=utf-8' },
      { body: review },
    );
    assert.equal(ok.status, 200, ok.text);
    assert.match(ok.text, /"allowed":true/);
    const structured = await post(
      identityStatus,
      '/',
      { 'content-type': 'application/cloudevents+json' },
      { body: '{"specversion":"1.0","id":"1","source":"/s","type":"dev.knative.sources.ping","data":{}}' },
    );
    assert.notEqual(structured.status, 415, structured.text);
  });

  it("a binary-mode ping is taken whatever its data's type (its payload is never read); any other event of that type is a 415", async () => {
    const ping = {
      'ce-specversion': '1.0',
      'ce-id': 'p1',
      'ce-source': '/apis/v1/namespaces/captf-system/pingsources/captf-resync',
      'ce-type': 'dev.knative.sources.ping',
    };
    for (const fn of [mirrorSync, identityStatus]) {
      for (const type of ['text/plain', 'text/plain; charset=us-ascii', 'application/octet-stream']) {
        const r = await post(fn, '/', { ...ping, 'content-type': type }, { body: 'resync, please' });
        assert.equal(r.status, 200, `${type}: ${r.text}`);
      }
      const other = { ...ping, 'ce-type': 'dev.knative.apiserver.ref.add', 'content-type': 'text/plain' };
      assert.equal((await post(fn, '/', other, { body: '{}' })).status, 415);
    }
  });

  it('a Content-Length over the limit is a 413 before any byte of the body is sent', async () => {
    for (const e of endpoints) {
      const r = await post(
        e.fn(),
        e.path,
        { 'content-type': 'application/json', 'content-length': e.limit + 1, ...e.headers?.() },
        { body: '' },
      );
      assert.equal(r.status, 413, `${e.name}: ${r.text}`);
      assert.match(r.text, /request body too large/);
    }
  });

  it('a chunked body of 200 MiB gets its 413 while still being sent; the server reads at most the limit and 64 KiB more', async (t) => {
    for (const e of endpoints) {
      const r = await upload(
        e.fn(),
        e.path,
        { 'content-type': 'application/json', ...e.headers?.() },
        200 * 1024 * 1024,
      );
      t.diagnostic(`${e.name}: 413 after ${r.written} bytes written; the server read ${r.serverRead}`);
      assert.equal(r.status, 413, `${e.name}: ${r.text}`);
      assert.ok(r.written < 200 * 1024 * 1024, `${e.name}: answered while the client was still sending`);
      assert.ok(r.serverRead <= e.limit + 64 * 1024 + 4096, `${e.name}: read ${r.serverRead} bytes`);
    }
  });

  it('prepare answers a missing token first: 401 before the type and the size are looked at', async () => {
    const cases: Record<string, string | number>[] = [
      { 'content-type': 'text/plain' },
      { 'content-type': 'application/json', 'content-length': DEFAULT_BODY_LIMIT + 1 },
    ];
    for (const headers of cases) {
      const r = await post(mirrorSync, '/prepare', headers, { body: '' });
      assert.equal(r.status, 401, r.text);
    }
  });

  it('every function still serves after all of it', async () => {
    for (const fn of [admission, mirrorSync, identityStatus]) {
      const r = await fetch(`http://127.0.0.1:${fn.port}/healthz`);
      assert.equal(r.status, 200);
    }
  });
});

describe('a body refused for want of room (the budget of bodies in flight)', () => {
  let server: Server;
  let port: number;
  let holder: Socket;
  let counted = 0;
  const budget = new BodyBudget(1024);
  const head = (length: number, path = '/', connection = 'keep-alive') =>
    `POST ${path} HTTP/1.1\r\nHost: fn\r\nConnection: ${connection}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;

  before(async () => {
    const app = createApp();
    app.post(
      '/',
      readBody({ types: JSON_TYPES, budget }),
      (req, res) => void res.json({ read: String(req.body).length }),
    );
    app.post('/count', (_req, res) => void res.json({ counted: ++counted }));
    app.use(errorHandler(captureLogger('bodies').logger));
    server = createServer(serverOptions(), app);
    limitIdleConnections(server);
    port = await listen(server, 0, '127.0.0.1');
    // The one body that always proceeds holds the budget, incomplete, for the whole suite.
    holder = connect(port, '127.0.0.1');
    holder.on('error', () => undefined);
    holder.write(head(4096) + ' '.repeat(100));
    await eventually('the first body to hold the budget', async () => budget.reserved > 0, 10_000, 20);
  });
  after(async () => {
    holder.destroy();
    await closeServer(server);
  });

  /** Sends `first`, waits `pauseMs` without reading, sends `rest`; what came back and how the connection ended. */
  async function refused(first: string, pauseMs: number, rest: string): Promise<{ text: string; failed: string }> {
    const s = connect(port, '127.0.0.1');
    s.pause();
    let text = '';
    let failed = '';
    s.on('data', (d: Buffer) => (text += d.toString('latin1')));
    s.on('error', (e: NodeJS.ErrnoException) => (failed = e.code ?? e.message));
    const closed = new Promise((resolve) => s.on('close', resolve));
    s.write(first);
    await sleep(pauseMs);
    s.write(rest);
    s.resume();
    await closed;
    return { text, failed };
  }

  it("a sender that reads late and sends the rest of its body seconds after the answer (past Node's keep-alive timeout) still reads its 503, kept alive or not: the connection ends after the body, not under it", async () => {
    const size = 2 * 1024 * 1024; // within the limit: the whole body is taken in
    const results = await Promise.all(
      ['keep-alive', 'close'].map(async (connection) => ({
        connection,
        ...(await refused(head(size, '/', connection) + ' '.repeat(size / 2), 7_000, ' '.repeat(size / 2))),
      })),
    );
    for (const r of results) {
      assert.equal(r.failed, '', `Connection: ${r.connection}: no reset while the body was still being sent`);
      assert.match(r.text, /^HTTP\/1\.1 503 /, `Connection: ${r.connection}`);
      assert.match(r.text, /send it again shortly/);
    }
  });

  it('a request sent behind a refused body on the same connection is not run', async () => {
    const body = ' '.repeat(2048);
    const r = await refused(head(body.length) + body, 0, head(2, '/count') + '{}');
    assert.match(r.text, /^HTTP\/1\.1 503 /);
    assert.doesNotMatch(r.text, /counted/);
    assert.equal(counted, 0, 'the second request ran');
  });
});
