/**
 * Server timeouts: every function's server has a headers timeout, a
 * whole-request timeout, a socket idle timeout and a keep-alive timeout
 * (functions/lib/http.ts `SERVER_TIMEOUTS`); body size is limited by `readBody`. A
 * slow-loris client sending one byte a second — in the headers, or in the body after complete
 * headers — is cut off within the documented bound, and so is a client that connects and sends
 * nothing; the server goes on serving. The time a handler spends on a complete request is not
 * idleness: an answer that takes longer than the idle timeout still arrives.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { after, before, describe, it } from 'node:test';
import { start as startAdmission } from '../../functions/admission/index.ts';
import {
  SERVER_TIMEOUTS,
  closeServer,
  createApp,
  errorHandler,
  JSON_TYPES,
  limitIdleConnections,
  readBody,
  listen,
  serverOptions,
  type FunctionHandle,
} from '../../functions/lib/http.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { admin, suffix } from '../helpers/cluster.ts';
import { captureLogger } from '../helpers/logs.ts';
import { startInProcess } from '../helpers/process.ts';

/** What a dripping client saw: when the server closed, what it answered, how many bytes it sent. */
interface Dripped {
  closedAfterMs: number;
  answer: string;
  sent: number;
}

/**
 * Connects, writes `prefix` at once, then one byte of `drip` every `everyMs` until the server
 * closes the connection (or `giveUpMs` passes, which fails the test).
 */
function drip(
  open: () => Socket,
  opts: { prefix?: string; drip: string; everyMs?: number; giveUpMs?: number },
): Promise<Dripped> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const socket = open();
    let answer = '';
    let sent = 0;
    let timer: NodeJS.Timeout | undefined;
    const giveUp = setTimeout(() => {
      socket.destroy();
      reject(new Error(`the server kept the connection open for ${opts.giveUpMs ?? 40_000} ms`));
    }, opts.giveUpMs ?? 40_000);
    const next = () => {
      if (socket.destroyed || sent >= opts.drip.length) return;
      socket.write(opts.drip[sent++]!);
      timer = setTimeout(next, opts.everyMs ?? 1_000);
    };
    socket.once('encrypted' in socket ? 'secureConnect' : 'connect', () => {
      if (opts.prefix) socket.write(opts.prefix);
      next();
    });
    socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      clearTimeout(giveUp);
      resolve({ closedAfterMs: Math.round(performance.now() - t0), answer, sent });
    });
  });
}

const HEAD = 'POST / HTTP/1.1\r\nHost: fn\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n';
/** Slack on top of a deadline: timers, the check interval's phase, a loaded CI machine. */
const SLACK_MS = 2_000;

describe('every server sets the timeouts of SERVER_TIMEOUTS', () => {
  const a = admin();
  const handles: { name: string; fn: FunctionHandle; open: () => Socket; path: string }[] = [];

  const dir = mkdtempSync(join(tmpdir(), 'captf-timeouts-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  before(async () => {
    const { leaf } = await createWebhookPair(dir, `captf-timeouts-ca-${suffix()}`);
    const base = { port: 0, host: '127.0.0.1', kubeconfig: a.kc };
    const [tls, plain] = await Promise.all([
      startAdmission({
        ...base,
        logger: captureLogger('admission').logger,
        env: { CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
      }),
      startInProcess(a.kc),
    ]);
    const started = [tls, plain.admission, plain.mirrorSync, plain.identityStatus];
    const names = ['admission (HTTPS)', 'admission (plain HTTP)', 'mirror-sync', 'identity-status'];
    started.forEach((fn, i) => {
      const open =
        fn.scheme === 'https'
          ? () => tlsConnect({ host: '127.0.0.1', port: fn.port, rejectUnauthorized: false })
          : () => netConnect(fn.port, '127.0.0.1');
      handles.push({ name: names[i]!, fn, open, path: names[i]!.startsWith('admission') ? '/validate' : '/' });
    });
  });
  after(async () => {
    await Promise.all(handles.map((h) => h.fn.close()));
  });

  it('headersTimeout, requestTimeout, keepAliveTimeout and the socket idle timeout are set', () => {
    for (const { name, fn } of handles) {
      assert.equal(fn.server.headersTimeout, SERVER_TIMEOUTS.headersMs, name);
      assert.equal(fn.server.requestTimeout, SERVER_TIMEOUTS.requestMs, name);
      assert.equal(fn.server.keepAliveTimeout, SERVER_TIMEOUTS.keepAliveMs, name);
      assert.equal(fn.server.timeout, SERVER_TIMEOUTS.idleMs, name);
    }
  });

  it('slow-loris, one byte a second: cut off in the headers, in the body, and when silent; still serving', async (t) => {
    const { headersMs, requestMs, idleMs, checkEveryMs } = SERVER_TIMEOUTS;
    const runs = handles.flatMap(({ name, open, path }) => [
      { name, what: 'headers', bound: headersMs + checkEveryMs, run: () => drip(open, { drip: HEAD }) },
      {
        name,
        what: 'body',
        bound: requestMs + checkEveryMs,
        run: () => drip(open, { prefix: HEAD.replace('POST / ', `POST ${path} `), drip: '{"a":"' + 'x'.repeat(990) }),
      },
      { name, what: 'silence', bound: idleMs, run: () => drip(open, { drip: '' }) },
    ]);
    const results = await Promise.all(runs.map(async (r) => ({ ...r, got: await r.run() })));
    for (const { name, what, bound, got } of results) {
      t.diagnostic(
        `${name}, ${what}: closed after ${got.closedAfterMs} ms (${got.sent} bytes sent; bound ${bound} ms)`,
      );
      assert.ok(got.closedAfterMs <= bound + SLACK_MS, `${name}, ${what}: closed after ${got.closedAfterMs} ms`);
      assert.ok(got.closedAfterMs >= Math.min(headersMs, idleMs) - 1_000, `${name}, ${what}: not by our timeout`);
      if (what !== 'silence') assert.match(got.answer, /^HTTP\/1\.1 408 /, `${name}, ${what}: 408`);
    }
    for (const { name, fn } of handles) {
      const scheme = fn.scheme === 'https' ? 'https' : 'http';
      if (scheme === 'https') continue; // the TLS one is checked by the raw socket above
      const r = await fetch(`${scheme}://127.0.0.1:${fn.port}/healthz`);
      assert.equal(r.status, 200, `${name} still serves`);
    }
  });
});

describe('the idle timeout does not count the time a handler works', () => {
  it('an answer that takes longer than the idle timeout arrives; a silent connection is closed', async () => {
    const t = { headersMs: 1_000, requestMs: 2_000, idleMs: 300, keepAliveMs: 500, checkEveryMs: 100, quietMs: 200 };
    const app = createApp();
    app.post('/slow', readBody({ types: JSON_TYPES }), async (_req, res) => {
      await new Promise((r) => setTimeout(r, 1_000));
      res.json({ done: true });
    });
    app.use(errorHandler(captureLogger('timeouts').logger));
    const server = createServer(serverOptions(t), app);
    limitIdleConnections(server, t);
    const port = await listen(server, 0, '127.0.0.1');
    try {
      const r = await fetch(`http://127.0.0.1:${port}/slow`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      });
      assert.deepEqual(await r.json(), { done: true });
      const silent = await drip(() => netConnect(port, '127.0.0.1'), { drip: '' });
      assert.ok(silent.closedAfterMs < 300 + 500, `closed after ${silent.closedAfterMs} ms`);
      const slowBody = await drip(() => netConnect(port, '127.0.0.1'), {
        prefix: HEAD.replace('POST / ', 'POST /slow '),
        drip: 'x'.repeat(100),
        everyMs: 100,
      });
      assert.ok(slowBody.closedAfterMs < 2_000 + 100 + 500, `closed after ${slowBody.closedAfterMs} ms`);
      assert.match(slowBody.answer, /^HTTP\/1\.1 408 /);
    } finally {
      await closeServer(server);
    }
  });
});
