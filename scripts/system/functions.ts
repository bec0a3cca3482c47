/**
 * The functions as processes of the container's entrypoint, started by the system
 * (./system.ts): from source (`node functions/main.ts <name>`, as `npm start` runs them) or as
 * the production bundle (`node dist/main.mjs <name>`, as the image does, with no compile cache:
 * the image ships none), on free loopback ports, each with the environment its rendered Knative Service sets
 * (bundles) or the local mode's (source), as the user the system chose for it.
 */
import { request } from 'node:https';
import { join } from 'node:path';
import type { KubernetesObject } from '@kubernetes/client-node';
import { buildBundles } from '../lib/bundles.ts';
import { isRunning, spawnFunction, type FunctionProcess } from '../lib/process.ts';
import { sleep } from '../lib/wait.ts';
import type { CertPair } from '../controlplane/pki.ts';
import { REPO_ROOT } from '../tools/build.ts';
import { FUNCTION_NAMES } from '../lib/warm-compile-cache.ts';

export { FUNCTION_NAMES };
/** One of {@link FUNCTION_NAMES}. */
export type FunctionName = (typeof FUNCTION_NAMES)[number];

/** How the functions run: from the TypeScript sources, or as the production bundles. */
export type FunctionsFrom = 'source' | 'bundles';

/** The entrypoint the functions run from, and what it is. */
export interface FunctionsBuild {
  main: string;
  from: FunctionsFrom;
}

/**
 * The entrypoint: the sources as they are, or the bundles built into `<dir>/app/dist`, started
 * as the image starts them: without a compile cache (the image ships none, docs/deploy-knative.md;
 * a warmed one made every start 60–85 ms kinder than production's).
 * @throws esbuild's error when a source does not compile.
 */
export async function buildFunctions(from: FunctionsFrom, dir: string): Promise<FunctionsBuild> {
  if (from === 'source') return { main: join(REPO_ROOT, 'functions', 'main.ts'), from };
  const built = await buildBundles({ outdir: join(dir, 'app', 'dist') });
  return { main: built.main, from };
}

interface Container {
  env?: { name: string; value?: string }[];
  resources?: { limits?: { memory?: string } };
}

/** The container of function `fn`'s rendered Knative Service (`captf-<fn>`), when there is one. */
export function knativeContainer(rendered: readonly KubernetesObject[], fn: FunctionName): Container | undefined {
  const svc = knativeService(rendered, fn) as { spec?: { template?: { spec?: { containers?: Container[] } } } };
  return svc?.spec?.template?.spec?.containers?.[0];
}

/** Function `fn`'s rendered Knative Service (serving.knative.dev/v1 `captf-<fn>`). */
export function knativeService(rendered: readonly KubernetesObject[], fn: FunctionName): KubernetesObject | undefined {
  return rendered.find(
    (o) => o.kind === 'Service' && o.apiVersion === 'serving.knative.dev/v1' && o.metadata?.name === `captf-${fn}`,
  );
}

/** What a function's environment is made of. */
export interface EnvInputs {
  build: FunctionsBuild;
  /** The kubeconfig it acts with. */
  kubeconfig: string;
  /** The admission webhook's serving certificate. */
  leaf: CertPair;
  rendered: readonly KubernetesObject[];
  /** Added last (a test's or the soak's scope). */
  extra?: Record<string, string> | undefined;
}

/**
 * A function's whole environment (nothing is inherited): loopback and a free port, and its
 * rendered Knative Service's variables (the heap caps of `NODE_OPTIONS` included, so a function
 * here has the memory it has in a pod); for the bundles `NODE_ENV=production`, as in the
 * image; from source, the local mode's `LOG_LEVEL` and `CAPTF_CONSUMER_KINDS` when set.
 * admission serves TLS with `leaf`. The event functions check their senders as shipped: this
 * world's Broker signs each delivery as the Trigger's OIDC ServiceAccount (the stand-in of
 * scripts/eventing/controllers.ts gives Triggers the identity Eventing does), and whoever
 * posts to them directly signs with system.ts `sign` (`extra` may turn the check off).
 */
export function functionEnv(name: FunctionName, i: EnvInputs): NodeJS.ProcessEnv {
  const service = Object.fromEntries(
    (knativeContainer(i.rendered, name)?.env ?? []).map((e) => [e.name, e.value ?? '']),
  );
  const fromService =
    i.build.from === 'bundles'
      ? { NODE_ENV: 'production', ...service }
      : {
          ...service,
          ...(service.NODE_OPTIONS ? { NODE_OPTIONS: withSourceHeap(service.NODE_OPTIONS) } : {}),
          HOME: process.env.HOME,
          LOG_LEVEL: process.env.LOG_LEVEL ?? service.LOG_LEVEL ?? 'info',
          ...(process.env.CAPTF_CONSUMER_KINDS ? { CAPTF_CONSUMER_KINDS: process.env.CAPTF_CONSUMER_KINDS } : {}),
        };
  return {
    PATH: process.env.PATH,
    ...fromService,
    PORT: '0',
    HOST: '127.0.0.1',
    KUBECONFIG: i.kubeconfig,
    ...(name === 'admission'
      ? { CAPTF_TLS_CERT_FILE: i.leaf.cert, CAPTF_TLS_KEY_FILE: i.leaf.key, CAPTF_ADMISSION_PLAIN_HTTP: 'false' }
      : {}),
    ...i.extra,
  };
}

/**
 * Old-space megabytes a function run from its TypeScript sources holds beyond the bundle it
 * ships as: idle, with a full collection, 37 MiB from source against 16 MiB from the bundle
 * (Node 24.21, each function), because every dependency is loaded as its own module.
 */
export const SOURCE_HEAP_OVERHEAD_MB = 32;

/**
 * `NODE_OPTIONS` for a run from source: the shipped `--max-old-space-size` plus
 * {@link SOURCE_HEAP_OVERHEAD_MB}, so the function has the headroom it has in its pod (at the
 * shipped cap, identity-status from source had 11 MiB left and the hostile-input fuzz ran it
 * out of heap).
 */
export function withSourceHeap(nodeOptions: string): string {
  return nodeOptions.replace(
    /--max-old-space-size=(\d+)/,
    (_m, mb: string) => `--max-old-space-size=${Number(mb) + SOURCE_HEAP_OVERHEAD_MB}`,
  );
}

/** Options of {@link startFunction}. */
export interface StartFunctionOptions {
  name: FunctionName;
  main: string;
  env: NodeJS.ProcessEnv;
  /** Its output, written as it arrives. */
  logFile: string;
  /** PEM of the CA of admission's serving certificate (its `/healthz` is over https). */
  caPem: string;
  onLine?: ((line: string) => void) | undefined;
}

/**
 * Starts a function and resolves once it logged the port it bound and `/healthz` answered
 * 200 (over https trusting `caPem` when it serves TLS).
 * @throws Error with its last output lines when it exits or does not become healthy.
 */
export async function startFunction(opts: StartFunctionOptions): Promise<FunctionProcess> {
  // Generous: four functions and Knative's processes start at once, on two cores shared with tests.
  const fn = await spawnFunction({ ...opts, listenTimeoutMs: 90_000 });
  try {
    await waitHealthy(fn, fn.scheme === 'https' ? opts.caPem : undefined);
  } catch (err) {
    await fn.stop(0);
    throw new Error(`${opts.name}: ${(err as Error).message}\n${fn.tail().join('\n')}`, { cause: err });
  }
  return fn;
}

/** GET `url` once: its status (https with `caPem` when given). */
function getStatus(url: string, caPem: string | undefined): Promise<number> {
  if (!caPem) return fetch(url, { signal: AbortSignal.timeout(2000) }).then((r) => r.status);
  return new Promise<number>((res, rej) => {
    const req = request(url, { ca: caPem, timeout: 2000 }, (r) => {
      r.resume();
      res(r.statusCode ?? 0);
    });
    req.on('error', rej);
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.end();
  });
}

/**
 * GETs the function's `/healthz` until it answers 200.
 * @throws Error when the function exits first or `timeoutMs` passes.
 */
async function waitHealthy(fn: FunctionProcess, caPem: string | undefined, timeoutMs = 60_000): Promise<void> {
  const url = `${fn.url}/healthz`;
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    if (!isRunning(fn.child)) throw new Error(`exited (${fn.child.exitCode ?? fn.child.signalCode})`);
    try {
      const status = await getStatus(url, caPem);
      if (status === 200) return;
      last = `HTTP ${status}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(100);
  }
  throw new Error(`${url} not healthy after ${timeoutMs} ms: ${last}`);
}
