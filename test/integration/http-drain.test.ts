/**
 * The stop on SIGTERM (SPEC §13): a function accepts nothing new, also on kept-alive
 * connections, finishes what is in flight and exits 0 within its drain deadline
 * (`CAPTF_DRAIN_SECONDS`), or 1 when answers are still in flight at the deadline.
 *
 * First the server's drain on its own (functions/lib/http.ts `closeServer`), then each
 * function as the container runs it, TERMed while Knative's Broker keeps delivering to it
 * through a tap that records what the Broker's filter saw on every connection. The API server
 * is reached through a proxy that holds each request, so a delivery is in flight at TERM.
 */
import assert from 'node:assert/strict';
import { Agent, createServer, request, type IncomingHttpHeaders } from 'node:http';
import { connect } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { freePort } from '../../scripts/lib/ports.ts';
import {
  closeServer,
  createApp,
  DEFAULT_DRAIN_SECONDS,
  drainMsFromEnv,
  JSON_TYPES,
  limitIdleConnections,
  listen,
  readBody,
  serverOptions,
  SERVER_TIMEOUTS,
  type ServerTimeouts,
} from '../../functions/lib/http.ts';
import { sleep } from '../../scripts/lib/wait.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import { RENDERED_MANIFESTS, postEvents, startBroker, startSink } from '../helpers/events.ts';
import { startFaultProxy, type FaultProxy } from '../helpers/fault-proxy.ts';
import * as fx from '../helpers/fixtures.ts';
import { consumerEvent } from '../helpers/mirror-sync.ts';
import { spawnFunction, type FunctionProcess } from '../helpers/process.ts';
import { startTap, type Tap, type TappedConnection } from '../helpers/sockets.ts';

/** A GET through `agent`: status and headers once the answer is read. */
function get(port: number, path: string, agent: Agent): Promise<{ status: number; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    request({ host: '127.0.0.1', port, path, agent }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers }));
    })
      .on('error', reject)
      .end();
  });
}

/**
 * A server like every function's (timeouts `t`), with `/slow` answering once the test releases
 * it, `/work` counting the requests it handled, and `POST /body` reading a JSON body.
 */
async function slowServer(t: ServerTimeouts = SERVER_TIMEOUTS) {
  const releases: (() => void)[] = [];
  let handled = 0;
  const app = createApp();
  app.get('/slow', async (_req, res) => {
    await new Promise<void>((r) => releases.push(r));
    res.json({ done: true });
  });
  app.get('/work', (_req, res) => {
    handled++;
    res.json({ done: true });
  });
  app.post('/body', readBody({ types: JSON_TYPES }), (_req, res) => {
    res.json({ done: true });
  });
  const server = createServer(serverOptions(t), app);
  limitIdleConnections(server, t);
  const port = await listen(server, 0, '127.0.0.1');
  const held = () => releases.length;
  const release = () => releases.splice(0).forEach((r) => r());
  return { server, port, held, release, handled: () => handled };
}

/** A raw connection: what it received, and a promise that settles when the server closed it. */
function raw(port: number) {
  const socket = connect(port, '127.0.0.1');
  let received = '';
  socket.on('data', (d: Buffer) => (received += d.toString('latin1')));
  socket.on('error', () => {});
  const closed = new Promise<void>((r) => socket.once('close', () => r()));
  return { socket, received: () => received, closed };
}

/** The status lines of every answer in `text`. */
const statusLines = (text: string) => text.match(/HTTP\/1\.1 \d{3}/g) ?? [];

describe('a server drains', () => {
  it('closes idle kept-alive connections once quiet for quietMs, refuses new ones, and ends each answer in flight with Connection: close', async () => {
    const s = await slowServer();
    const tap = await startTap(s.port);
    const agent = new Agent({ keepAlive: true });
    try {
      const port = Number(new URL(tap.url).port);
      const slow = get(port, '/slow', agent);
      await eventually('the slow request held', async () => s.held() === 1);
      // A second connection (the first is busy), answered and left idle in the agent's pool.
      assert.equal((await get(port, '/healthz', agent)).headers.connection, 'keep-alive');
      const drained = closeServer(s.server);
      const idle = tap.connections[1]!;
      await eventually('the idle connection closed by the server', async () => idle.closed === 'server');
      await assert.rejects(get(s.port, '/healthz', new Agent()), { code: 'ECONNREFUSED' });
      s.release();
      const answer = await slow;
      assert.equal(answer.status, 200);
      assert.equal(answer.headers.connection, 'close', 'the answer in flight is its connection’s last');
      assert.equal(await drained, true);
      assert.deepEqual(
        tap.connections.map((c) => c.cut),
        [false, false],
        'no request was cut',
      );
    } finally {
      agent.destroy();
      s.release();
      s.server.closeAllConnections();
      await tap.close();
    }
  });

  it('gives up at the deadline while an answer is in flight, and lets that answer finish', async () => {
    const s = await slowServer();
    const agent = new Agent({ keepAlive: true });
    try {
      const slow = get(s.port, '/slow', agent);
      await eventually('the slow request held', async () => s.held() === 1);
      assert.equal(await closeServer(s.server, 200), false);
      s.release();
      const answer = await slow;
      assert.equal(answer.status, 200);
      assert.equal(answer.headers.connection, 'close');
    } finally {
      agent.destroy();
      s.release();
      s.server.closeAllConnections();
    }
  });

  it('closes a connection that has sent no request yet once quiet for quietMs, and never handles a request sent after the drain began', async () => {
    const s = await slowServer();
    try {
      const fresh = raw(s.port);
      const busy = raw(s.port);
      await new Promise((r) => fresh.socket.once('connect', r));
      busy.socket.write('GET /slow HTTP/1.1\r\nHost: x\r\n\r\n');
      await eventually('the slow request held', async () => s.held() === 1);
      const drained = closeServer(s.server);
      await fresh.closed;
      // Pipelined behind the answer in flight: it reaches the server, which must not handle it.
      busy.socket.write('GET /work HTTP/1.1\r\nHost: x\r\n\r\n');
      await sleep(200);
      s.release();
      await busy.closed;
      assert.equal(await drained, true);
      assert.equal(fresh.received(), '', 'nothing was answered on the fresh connection');
      assert.deepEqual(statusLines(busy.received()).slice(0, 1), ['HTTP/1.1 200']);
      assert.equal(s.handled(), 0, 'the request sent after the drain began was not handled');
    } finally {
      s.release();
      s.server.closeAllConnections();
    }
  });

  it('a request already on its way on a quiet connection (fresh or kept alive) when the drain begins gets a 503 with Connection: close, not a cut', async () => {
    const s = await slowServer();
    try {
      const fresh = raw(s.port);
      const kept = raw(s.port);
      await new Promise((r) => fresh.socket.once('connect', r));
      kept.socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
      await eventually('the kept-alive answer', async () => statusLines(kept.received()).length === 1);
      const drained = closeServer(s.server);
      // What a client sends in the moment it cannot yet know: the connections are still open.
      await sleep(50);
      fresh.socket.write('GET /work HTTP/1.1\r\nHost: x\r\n\r\n');
      kept.socket.write('GET /work HTTP/1.1\r\nHost: x\r\n\r\n');
      await Promise.all([fresh.closed, kept.closed]);
      assert.equal(await drained, true);
      assert.deepEqual(statusLines(fresh.received()), ['HTTP/1.1 503']);
      assert.deepEqual(statusLines(kept.received()), ['HTTP/1.1 200', 'HTTP/1.1 503']);
      for (const c of [fresh, kept]) assert.match(c.received(), /\r\nconnection: close\r\n/i);
      assert.equal(s.handled(), 0);
    } finally {
      s.server.closeAllConnections();
    }
  });

  it('answers a request that arrives while it drains 503 with Retry-After: 1, and runs no handler', async () => {
    const s = await slowServer();
    try {
      const c = raw(s.port);
      // A kept-alive connection that carried a request, then began another before the drain.
      c.socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
      await eventually('the first answer', async () => statusLines(c.received()).length === 1);
      c.socket.write('GET /work HTTP/1.1\r\nHost: x\r\n');
      await sleep(100);
      const drained = closeServer(s.server);
      c.socket.write('\r\n');
      await c.closed;
      assert.equal(await drained, true);
      assert.deepEqual(statusLines(c.received()), ['HTTP/1.1 200', 'HTTP/1.1 503']);
      assert.match(c.received(), /\r\nretry-after: 1\r\n/i);
      assert.match(c.received(), /\r\nconnection: close\r\n/i);
      assert.equal(s.handled(), 0);
    } finally {
      s.server.closeAllConnections();
    }
  });

  it('answers every request pipelined before the drain began, the last one with Connection: close', async () => {
    const s = await slowServer();
    try {
      const c = raw(s.port);
      c.socket.write('GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n');
      await eventually('both requests held', async () => s.held() === 2);
      const drained = closeServer(s.server);
      s.release();
      await c.closed;
      assert.equal(await drained, true);
      assert.deepEqual(statusLines(c.received()), ['HTTP/1.1 200', 'HTTP/1.1 200']);
      assert.match(c.received().split('HTTP/1.1 200')[2]!, /\r\nConnection: close\r\n/i);
    } finally {
      s.release();
      s.server.closeAllConnections();
    }
  });

  it('waits for a handler whose client went away: its work is still in flight', async () => {
    const s = await slowServer();
    try {
      const c = raw(s.port);
      c.socket.write('GET /slow HTTP/1.1\r\nHost: x\r\n\r\n');
      await eventually('the slow request held', async () => s.held() === 1);
      c.socket.destroy();
      await c.closed;
      let settled = false;
      const drained = closeServer(s.server).then((d) => ((settled = true), d));
      await sleep(300);
      assert.equal(settled, false, 'the drain did not end while the handler worked');
      s.release();
      assert.equal(await drained, true);
    } finally {
      s.release();
    }
  });

  it('keeps cutting slow senders while it drains: dripped headers at once, a dripped body at its request deadline', async () => {
    const t = { headersMs: 500, requestMs: 1_000, idleMs: 10_000, keepAliveMs: 500, checkEveryMs: 100, quietMs: 200 };
    const s = await slowServer(t);
    const body = raw(s.port);
    const head = raw(s.port);
    const drip = setInterval(() => {
      body.socket.write('x');
      head.socket.write('x');
    }, 100);
    try {
      body.socket.write(
        'POST /body HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{',
      );
      head.socket.write('GET /work HTTP/1.1\r\nX-Slow: ');
      await sleep(200);
      // Far inside the deadline: only the server's own bounds can end the drain this soon.
      assert.equal(await closeServer(s.server, 5_000), true);
      assert.equal(s.handled(), 0);
    } finally {
      clearInterval(drip);
      s.server.closeAllConnections();
    }
  });

  it('takes its deadline from CAPTF_DRAIN_SECONDS, whole seconds from 1 to 3600', () => {
    assert.equal(drainMsFromEnv({}), DEFAULT_DRAIN_SECONDS * 1000);
    assert.equal(drainMsFromEnv({ CAPTF_DRAIN_SECONDS: '600' }), 600_000);
    for (const bad of ['0', '3601', '1.5', '-1', 'soon', '1e3'])
      assert.throws(() => drainMsFromEnv({ CAPTF_DRAIN_SECONDS: bad }), /CAPTF_DRAIN_SECONDS/, bad);
  });
});

/** How long the proxy holds each API request of the functions under test (ms). */
const HOLD_MS = 1_500;

const w = fx.world('drain');
const SCOPE = `captf-test/drain=${suffix()}`;
let slowApi: FaultProxy;
let stopBroker: (() => Promise<void>) | undefined;
let posting: NodeJS.Timeout | undefined;
/** Aborts the posts the Broker's ingress still holds (it answers once it has delivered). */
const posts = new AbortController();
const running: FunctionProcess[] = [];
const taps: Tap[] = [];

/** A spawned function with a tap in front, the API server behind the holding proxy. */
async function tapped(name: string, env: NodeJS.ProcessEnv = {}): Promise<{ fn: FunctionProcess; tap: Tap }> {
  const fn = await spawnFunction(name, { KUBECONFIG: slowApi.kubeconfigPath, HOST: '127.0.0.1', ...env });
  running.push(fn);
  const tap = await startTap(fn.port);
  taps.push(tap);
  return { fn, tap };
}

/** The function's JSON log line whose message is `message`, if any. */
function logLine(fn: FunctionProcess, message: string): Record<string, unknown> | undefined {
  for (const line of fn.output().split('\n')) {
    if (!line.includes(`"${message}"`)) continue;
    const j = JSON.parse(line) as Record<string, unknown>;
    if (j.message === message) return j;
  }
  return undefined;
}

before(async () => {
  slowApi = await startFaultProxy(async () => {
    await sleep(HOLD_MS);
    return undefined;
  });
});

after(async () => {
  clearInterval(posting);
  posts.abort();
  for (const fn of running) fn.kill();
  for (const tap of taps) await tap.close();
  await stopBroker?.();
  slowApi?.close();
});

describe("TERM while Knative's Broker keeps delivering", () => {
  const fns: Record<string, { fn: FunctionProcess; tap: Tap }> = {};

  before(async () => {
    const ns = await w.namespace();
    for (const name of ['mirror-sync', 'identity-status']) {
      fns[name] = await tapped(name, { CAPTF_STATUS_IDENTITY_SELECTOR: SCOPE });
    }
    const deadLetters = await startSink();
    const dp = await startBroker({
      objects: await render(RENDERED_MANIFESTS),
      namespace: ns,
      sinks: {
        'captf-mirror-sync': fns['mirror-sync']!.tap.url,
        'captf-identity-status': fns['identity-status']!.tap.url,
        'captf-dead-letters': deadLetters.url,
      },
      // identity-status gets a status ping every second; mirror-sync the consumer events below.
      schedules: { 'captf-identity-status': '* * * * * *' },
    });
    stopBroker = async () => {
      await dp.stop();
      deadLetters.server.close();
    };
    let n = 0;
    posting = setInterval(() => {
      const ghost = fx.consumer(`ghost-${n++}`, fx.inNamespace(ns));
      postEvents(dp.brokerUrl, consumerEvent(ghost), 'binary', posts.signal).catch(() => {});
    }, 250);
  });

  for (const name of ['mirror-sync', 'identity-status'])
    it(`${name}: the delivery in flight is answered and closes its connection, nothing new is handled, exit 0`, async () => {
      const { fn, tap } = fns[name]!;
      await eventually(
        'a delivery answered, and the next one in flight for a while',
        async () =>
          tap.connections.some((c) => c.answers.length > 0) && Date.now() - (tap.oldestPending() ?? Infinity) > 200,
        60_000,
      );
      const inFlightAtTerm = tap.connections.filter((c) => c.pending);
      fn.child.kill('SIGTERM');
      assert.equal(await fn.exited, 0, fn.tail().join('\n'));
      await sleep(1_000); // the Broker goes on delivering (and retrying) meanwhile

      const stopping = logLine(fn, 'stopping')!;
      assert.ok(Number(stopping.inFlight) >= 1, `in flight at TERM: ${JSON.stringify(stopping)}`);
      assert.ok(logLine(fn, 'stopped'), 'it says it stopped');
      const reached = tap.connections.filter((c) => !c.refused);
      assert.deepEqual(cutOff(reached), [], 'no delivery cut');
      // Pending at the tap is not yet handled by the function: a request sent just before TERM
      // may reach it after the drain began and is then refused (503, below). Each one the
      // function was handling (its own count at TERM) is answered 2xx; every one closes.
      for (const c of inFlightAtTerm) {
        assert.match(c.answers.at(-1) ?? '', /^http\/1\.1 (2\d\d|503) /, 'the delivery in flight is answered');
        assert.match(c.answers.at(-1)!, /\r\nconnection: close(\r\n|$)/, 'and its connection closes after it');
      }
      const handled = inFlightAtTerm.filter((c) => /^http\/1\.1 2\d\d /.test(c.answers.at(-1)!)).length;
      assert.ok(
        handled >= Number(stopping.inFlight),
        `${handled} answered 2xx of ${stopping.inFlight} in flight at TERM`,
      );
      const since = Date.parse(String(stopping.timestamp));
      // A delivery already on its way on an open connection when the drain began is refused, not
      // handled: 503 with Connection: close (the Broker sends it again elsewhere).
      const late = reached.flatMap((c) => c.requests.map((t, i) => ({ t, answer: c.answers[i] ?? '(none)' })));
      for (const { answer } of late.filter((r) => r.t > since)) {
        assert.match(answer, /^http\/1\.1 503 /, 'a delivery that reached it after it began to stop is refused');
        assert.match(answer, /\r\nconnection: close(\r\n|$)/);
      }
      assert.ok(
        tap.connections.some((c) => c.refused),
        'the Broker went on delivering: its new connections were refused',
      );
    });
});

/** The connections a request was cut off on, for an assertion message. */
const cutOff = (cs: TappedConnection[]) => cs.filter((c) => c.cut).map((c) => ({ requests: c.requests.length }));

describe('the drain deadline', () => {
  it('a function whose answer outlives CAPTF_DRAIN_SECONDS exits 1 at the deadline and says why', async () => {
    const { fn } = await tapped('mirror-sync', { CAPTF_DRAIN_SECONDS: '1' });
    const ns = await w.namespace();
    // Held by the proxy for HOLD_MS per API request: longer than the 1 s deadline.
    const delivery = postEvents(fn.url, consumerEvent(fx.consumer('ghost', fx.inNamespace(ns)))).catch(() => {});
    await sleep(300);
    fn.child.kill('SIGTERM');
    assert.equal(await fn.exited, 1);
    const warned = logLine(fn, 'answers still in flight at the drain deadline; exiting');
    assert.ok(warned, fn.tail().join('\n'));
    assert.equal(warned.inFlight, 1);
    assert.equal(warned.drainSeconds, 1);
    await delivery;
  });

  it('with telemetry on, the last push fits inside the deadline: a receiver that is down does not hold the stop past it', async () => {
    const nobody = `http://127.0.0.1:${await freePort()}`;
    const { fn } = await tapped('mirror-sync', { CAPTF_DRAIN_SECONDS: '2', OTEL_EXPORTER_OTLP_ENDPOINT: nobody });
    const ns = await w.namespace();
    const delivery = postEvents(fn.url, consumerEvent(fx.consumer('ghost', fx.inNamespace(ns)))).catch(() => {});
    await sleep(300);
    const t0 = performance.now();
    fn.child.kill('SIGTERM');
    assert.equal(await fn.exited, 1);
    // The grace period is the deadline: before, the push's own 5 s came after the 2 s drain.
    const stoppedMs = performance.now() - t0;
    assert.ok(stoppedMs < 2_000 + 1_500, `stopped after ${Math.round(stoppedMs)} ms`);
    await delivery;
  });
});
