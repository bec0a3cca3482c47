/**
 * Row "cold start": spawn a function's production bundle (as the image runs it: no compile
 * cache) → its first answered real request: admission an AdmissionReview (with its
 * SubjectAccessReview), mirror-sync an event about an existing consumer (a reconcile),
 * identity-status a ping. Baseline: a bare Node HTTP server, spawn → first answer. Beside them
 * the library floor (../floors/client-node.ts): the bare server after loading client-node and
 * making the functions' API clients, which every function does before its first answer.
 */
import { spawn } from 'node:child_process';
import { request } from 'node:https';
import { join } from 'node:path';
import { bareNodeServer } from '../baselines.ts';
import {
  consumerBody,
  consumerEvent,
  consumersPath,
  createNamespaces,
  hasTrue,
  pingEvent,
  postEvent,
  signedWith,
  type Consumer,
  type EventRequest,
} from '../fixtures.ts';
import type { Figure } from '../report.ts';
import { bundleEntry } from '../../lib/bundles.ts';
import { spawnFunction } from '../../lib/process.ts';
import type { FunctionName } from '../../system/functions.ts';
import type { EventFunction } from '../../system/senders.ts';
import type { RowContext } from './context.ts';
import { BURST_IDENTITY } from './fan-in.ts';

function postTls(url: string, caPem: string, body: string): Promise<number> {
  return new Promise((res, rej) => {
    const req = request(url, { method: 'POST', ca: caPem, headers: { 'content-type': 'application/json' } }, (r) => {
      r.resume();
      r.on('end', () => res(r.statusCode ?? 0));
    });
    req.on('error', rej);
    req.end(body);
  });
}

/** The AdmissionReview both cold-start rows send admission first: a create by system:masters (one SubjectAccessReview). */
export const COLD_START_REVIEW = JSON.stringify({
  apiVersion: 'admission.k8s.io/v1',
  kind: 'AdmissionReview',
  request: {
    uid: 'bench',
    operation: 'CREATE',
    name: 'bench-cold',
    userInfo: { username: 'admin', groups: ['system:masters'] },
    object: {
      apiVersion: 'infrastructure.cluster.x-k8s.io/v1beta2',
      kind: 'TerraformClusterIdentity',
      metadata: { name: 'bench-cold' },
      spec: {
        secretRef: { name: 'bench-resync-creds', namespace: 'captf-system' },
        allowedNamespaces: { list: ['a'] },
      },
    },
  },
});

/** Spawns `node <script>` with `env` → its first answered GET (it prints `{"port":N}` when listening); ms. */
async function spawnUntilAnswer(script: string, env: NodeJS.ProcessEnv): Promise<number> {
  const t0 = performance.now();
  const child = spawn(process.execPath, [script], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    const port = await new Promise<number>((res, rej) => {
      child.stdout.once('data', (d: Buffer) => res((JSON.parse(d.toString()) as { port: number }).port));
      child.once('exit', (code) => rej(new Error(`${script} exited ${code}`)));
    });
    await (await fetch(`http://127.0.0.1:${port}/`)).text();
    return performance.now() - t0;
  } finally {
    child.kill('SIGKILL');
  }
}

/** The bare server's cold starts and, interleaved with them, the library floor's (its figure). */
async function floors(ctx: RowContext, runs: number): Promise<{ bare: number[]; figure: Figure }> {
  // The floor runs with mirror-sync's environment: the same heap caps and kubeconfig.
  const floor = await bundleEntry('scripts/bench/floors/client-node.ts', join(ctx.sys.dir, 'floors'));
  const bare: number[] = [];
  const library: number[] = [];
  for (let i = 0; i < runs; i++) {
    bare.push((await bareNodeServer()).ms);
    library.push(await spawnUntilAnswer(floor, ctx.sys.functionEnv('mirror-sync')));
  }
  return {
    bare,
    figure: {
      row: 'cold start',
      what: 'library floor: a bare server that first loads client-node and makes the API clients',
      unit: 'ms',
      samples: library,
      baseline: { what: 'bare Node HTTP server', samples: bare },
    },
  };
}

/**
 * @param runs spawns per function (and of the bare server and the library floor, interleaved).
 * @throws Error when a function does not answer its first request with 2xx.
 */
export async function coldStartRow(ctx: RowContext, runs: number): Promise<Figure[]> {
  const first = await coldStartFixture(ctx);
  const { bare, figure } = await floors(ctx, runs);
  const figures: Figure[] = [figure];
  for (const name of ['admission', 'mirror-sync', 'identity-status'] as const) {
    const samples: number[] = [];
    for (let i = 0; i < runs; i++) samples.push(await coldStart(ctx, first, { name, label: `${i}` }));
    figures.push({
      row: 'cold start',
      what: `${name}: spawn → first real answer`,
      unit: 'ms',
      samples,
      baseline: { what: 'bare Node HTTP server', samples: bare },
    });
  }
  return figures;
}

/** Each function's first real request, as {@link coldStart} sends it. */
export type FirstRequests = Record<FunctionName, (url: string) => Promise<number>>;

/**
 * One cold start: spawns `run.name`'s bundle with its environment (plus `run.env`; `run.label`
 * names its log file) and sends its first real request. @returns ms from spawn to that answer.
 * @throws Error when it is not answered 2xx.
 */
export async function coldStart(
  ctx: RowContext,
  first: FirstRequests,
  run: { name: FunctionName; label: string; env?: NodeJS.ProcessEnv },
): Promise<number> {
  const { name, label, env = {} } = run;
  const { sys } = ctx;
  const t0 = performance.now();
  const fn = await spawnFunction({
    main: sys.main,
    name,
    env: { ...sys.functionEnv(name), ...env },
    logFile: join(sys.dir, 'logs', `cold-${name}-${label}.log`),
  });
  try {
    const status = await first[name](fn.url);
    if (status < 200 || status > 299) throw new Error(`${name}'s first request answered ${status}`);
    return performance.now() - t0;
  } finally {
    await fn.stop();
  }
}

/**
 * A mirrored consumer for mirror-sync's first reconcile, in a namespace of its own.
 * @returns each function's first request. @throws Error when it is not mirrored in time.
 */
export async function coldStartFixture(ctx: RowContext): Promise<FirstRequests> {
  const { sys } = ctx;
  const ns = ctx.next('cold');
  await createNamespaces(sys.admin, [ns]);
  sys.events.fronts['mirror-sync'].mode = { kind: 'deliver', targets: [sys.functions['mirror-sync'].url] };
  await sys.admin.call(
    'POST',
    consumersPath('terraformmachines', ns),
    consumerBody('terraformmachines', 'm-0', BURST_IDENTITY),
  );
  const deadline = Date.now() + ctx.timeoutMs;
  while (
    !hasTrue(
      await sys.admin.call<Consumer>('GET', `${consumersPath('terraformmachines', ns)}/m-0`),
      'CredentialsMirrored',
    )
  ) {
    if (Date.now() > deadline) throw new Error('the cold-start fixture consumer was never mirrored');
    await new Promise((r) => setTimeout(r, 200));
  }
  sys.events.fronts['mirror-sync'].mode = { kind: 'drop' };
  return firstRequests(sys, ns);
}

/**
 * The first request of each function's cold start, as its real sender makes it: an
 * AdmissionReview over TLS, a consumer event and a ping signed as their Triggers sign them.
 * @returns each function's request, resolving to its status.
 */
function firstRequests(sys: RowContext['sys'], ns: string): FirstRequests {
  const signed = async (fn: EventFunction, url: string, ev: EventRequest) =>
    (await postEvent(`${url}/`, signedWith(await sys.sign(fn), ev))).status;
  return {
    admission: (url) => postTls(`${url}/validate`, sys.webhookCaPem, COLD_START_REVIEW),
    'mirror-sync': (url) => signed('mirror-sync', url, consumerEvent('terraformmachines', ns, 'm-0')),
    'identity-status': (url) => signed('identity-status', url, pingEvent('captf-identity-status')),
    // What the Broker gives up on is an event like any other: a ping will do.
    'dead-letters': (url) => signed('dead-letters', url, pingEvent('captf-resync')),
  };
}
