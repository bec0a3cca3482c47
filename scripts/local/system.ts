/**
 * The whole system on one machine (SPEC §14), shared by `npm start` and `npm run demo`:
 * a control plane (embedded, or a cluster the user named), the CRDs, the three functions as
 * child processes of the container's entrypoint (`node functions/main.ts <name>`), and the
 * wiring Knative would provide — the admission webhook over HTTPS registered by a
 * ValidatingWebhookConfiguration, API events as CloudEvents (the real ApiServerSource
 * adapter when built, else ./events.ts), and PingSource-like ticks.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync } from 'node:fs';
import { request } from 'node:https';
import { join } from 'node:path';
import {
  AdmissionregistrationV1Api,
  CoreV1Api,
  KubeConfig,
  makeInformer,
  type KubernetesListObject,
  type V1Secret,
} from '@kubernetes/client-node';
import { GROUP, IDENTITY_PLURAL, VERSION } from '../../functions/lib/api.ts';
import { consumerKindsFromEnv } from '../../functions/lib/consumers.ts';
import { describeError, isNotFound } from '../../functions/lib/kube.ts';
import { ANNOTATION_IDENTITY, ANNOTATION_SOURCE_HASH, LABEL_MIRRORED } from '../../functions/lib/mirror.ts';
import { builtGoBinary } from '../build-lock.ts';
import { REPO_ROOT } from '../controlplane/build.ts';
import { startControlPlane, type ControlPlane } from '../controlplane/controlplane.ts';
import { installCRDs } from '../controlplane/crds.ts';
import { createCA, createLeaf } from '../controlplane/pki.ts';
import {
  KNATIVE_TOOLS,
  ensureApiServerSourceAdapter,
  startApiServerSourceAdapter,
  type RunningAdapter,
  type SourceConfig,
} from '../knative.ts';
import {
  Delivery,
  pingMessage,
  schedulePing,
  startLocalEventSource,
  waitForWatchCaches,
  watchedResources,
  type LocalEventSource,
} from './events.ts';
import { LogPrinter, describeMirrorChange, formatLine, type MirrorView, type Printed } from './print.ts';

/** The functions `npm start` runs, in start order. */
export const FUNCTION_NAMES = ['admission', 'mirror-sync', 'identity-status'] as const;
/** One of {@link FUNCTION_NAMES}. */
export type FunctionName = (typeof FUNCTION_NAMES)[number];

/** Name of the ValidatingWebhookConfiguration registered for the local admission function. */
export const WEBHOOK_CONFIGURATION = 'captf-credentials-local';
/** PingSource names, as in the manifests (manifests/base/eventing.yaml). */
export const PINGS = { status: 'captf-identity-status', resync: 'captf-resync' } as const;

/** Options of {@link startSystem}. */
export interface SystemOptions {
  /** State folder: the embedded control plane's (wiped on start), webhook certificates, logs. */
  dir: string;
  /** Run against this kubeconfig instead of an embedded control plane. */
  kubeconfig?: string | undefined;
  /** With `kubeconfig`: install the CRDs (and the webhook when the API server is on loopback). */
  install?: boolean;
  /** Identity status ping interval in ms (default 5 minutes). */
  statusEveryMs?: number;
  /** Resync ping interval in ms (default 10 minutes). */
  resyncEveryMs?: number;
  /** `auto`: the real adapter when already built, else the local source; `build`: build it if needed; `local`: never the adapter. */
  eventSource?: 'auto' | 'build' | 'local';
  /** Trigger-like delivery back-off base in ms (default 1000). */
  backoffMs?: number;
  /** Receives each readable line (debug ones too; the caller filters). */
  print: (p: Printed) => void;
  /** Progress lines while starting (build, control plane). */
  progress: (line: string) => void;
  /** Every raw output line of the functions and adapters, before printing (the demo scans them). */
  onRawLine?: (component: string, line: string) => void;
}

/** A running function process. */
export interface RunningFunction {
  name: FunctionName;
  url: string;
  process: ChildProcess;
}

/** The running system. */
export interface RunningSystem {
  kubeconfigPath: string;
  /** API server URL. */
  server: string;
  /** Set when the control plane is embedded. */
  controlPlane?: ControlPlane;
  functions: Record<FunctionName, RunningFunction>;
  /** Which event source delivers API events. */
  eventSource: 'adapter' | 'local';
  /** Whether the ValidatingWebhookConfiguration was registered. */
  webhook: boolean;
  /** Sends one PingSource tick now and resolves when it was delivered (or given up on). */
  ping(which: keyof typeof PINGS): Promise<void>;
  /** Stops everything this call started, in reverse order; idempotent. */
  stop(): Promise<void>;
}

/** Lines of a stream, one callback per complete line. */
function lines(stream: NodeJS.ReadableStream, onLine: (l: string) => void): void {
  let partial = '';
  stream.on('data', (d: Buffer) => {
    const parts = (partial + d.toString()).split('\n');
    partial = parts.pop() ?? '';
    for (const p of parts) onLine(p);
  });
  stream.on('end', () => partial && onLine(partial));
}

function isLoopback(server: string): boolean {
  const host = new URL(server).hostname;
  return host === '127.0.0.1' || host === 'localhost' || host === '[::1]';
}

/** GET `url` until it answers 200 (https with `caPem` when given). */
async function waitHealthy(
  url: string,
  caPem: string | undefined,
  child: ChildProcess,
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null)
      throw new Error(`exited (${child.exitCode ?? child.signalCode})`);
    try {
      const status = caPem
        ? await new Promise<number>((res, rej) => {
            const req = request(url, { ca: caPem, timeout: 2000 }, (r) => {
              r.resume();
              res(r.statusCode ?? 0);
            });
            req.on('error', rej);
            req.on('timeout', () => req.destroy(new Error('timeout')));
            req.end();
          })
        : (await fetch(url, { signal: AbortSignal.timeout(2000) })).status;
      if (status === 200) return;
      last = `HTTP ${status}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} not healthy after ${timeoutMs} ms: ${last}`);
}

/**
 * Starts the function `name` as `node functions/main.ts <name>` with `PORT=0` and resolves
 * with its URL once it logged the port it bound and `/healthz` answered 200.
 * @throws Error with its last output lines when it exits or does not become healthy.
 */
async function startFunction(
  name: FunctionName,
  env: NodeJS.ProcessEnv,
  caPem: string | undefined,
  onLine: (l: string) => void,
): Promise<RunningFunction> {
  const child = spawn(process.execPath, [join(REPO_ROOT, 'functions', 'main.ts'), name], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    cwd: REPO_ROOT,
  });
  // Last resort, as for the control plane: a parent that exits abruptly leaves no function behind.
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  child.once('exit', () => process.off('exit', killOnExit));
  const tail: string[] = [];
  let portSeen!: (p: { port: number; scheme: string }) => void;
  const bound = new Promise<{ port: number; scheme: string }>((r) => (portSeen = r));
  const handle = (l: string) => {
    tail.push(l);
    if (tail.length > 20) tail.shift();
    try {
      const j = JSON.parse(l) as { message?: string; port?: number; scheme?: string };
      if (j.message === 'listening' && typeof j.port === 'number')
        portSeen({ port: j.port, scheme: j.scheme ?? 'http' });
    } catch {
      // plain text (e.g. "cannot start"): printed as is
    }
    onLine(l);
  };
  lines(child.stdout!, handle);
  lines(child.stderr!, handle);
  const exited = new Promise<'exited'>((r) => child.once('exit', () => r('exited')));
  const first = await Promise.race([
    bound,
    exited,
    new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 30_000).unref()),
  ]);
  if (first === 'exited' || first === 'timeout') {
    child.kill('SIGKILL');
    throw new Error(
      `${name} ${first === 'exited' ? `exited (${child.exitCode ?? child.signalCode})` : 'did not listen within 30 s'}:\n${tail.join('\n')}`,
    );
  }
  const url = `${first.scheme}://127.0.0.1:${first.port}`;
  try {
    await waitHealthy(`${url}/healthz`, first.scheme === 'https' ? caPem : undefined, child);
  } catch (err) {
    child.kill('SIGKILL');
    throw new Error(`${name}: ${(err as Error).message}\n${tail.join('\n')}`);
  }
  return { name, url, process: child };
}

/** SIGTERM (graceful: in-flight requests finish), SIGKILL after `graceMs`. */
async function stopProcess(child: ChildProcess, graceMs = 10_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(t);
}

/**
 * The ValidatingWebhookConfiguration of SPEC §10 for a webhook at `url`: CREATE, UPDATE and
 * DELETE of identities only, failurePolicy Fail, sideEffects None, AdmissionReview v1.
 */
export function webhookConfiguration(url: string, caBundlePem: string) {
  return {
    apiVersion: 'admissionregistration.k8s.io/v1',
    kind: 'ValidatingWebhookConfiguration',
    metadata: {
      name: WEBHOOK_CONFIGURATION,
      labels: { 'app.kubernetes.io/part-of': 'captf-credentials', 'app.kubernetes.io/managed-by': 'captf-local' },
    },
    webhooks: [
      {
        name: 'identities.captf-credentials.local',
        clientConfig: { url: `${url}/validate`, caBundle: Buffer.from(caBundlePem).toString('base64') },
        rules: [
          {
            apiGroups: [GROUP],
            apiVersions: [VERSION],
            operations: ['CREATE', 'UPDATE', 'DELETE'],
            resources: [IDENTITY_PLURAL],
            scope: 'Cluster',
          },
        ],
        failurePolicy: 'Fail',
        sideEffects: 'None',
        admissionReviewVersions: ['v1'],
        timeoutSeconds: 10,
      },
    ],
  };
}

/** Path of the receive adapter when it was built already (nothing is built here). */
export function builtAdapterPath(): string | undefined {
  return builtGoBinary(KNATIVE_TOOLS, 'knative', 'apiserver_receive_adapter');
}

/**
 * Starts everything, in order: control plane (embedded unless `opts.kubeconfig`), CRDs, the
 * webhook's serving certificate, the three functions, the webhook registration, the event
 * source, the mirror watch that prints mirror changes, and the ping schedules.
 * @returns the running system; call `stop()` to end it.
 * @throws Error saying which step failed; everything started before it is stopped first.
 */
export async function startSystem(opts: SystemOptions): Promise<RunningSystem> {
  const cleanups: (() => Promise<void> | void)[] = [];
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    for (const c of cleanups.reverse()) {
      try {
        await c();
      } catch (err) {
        opts.progress(`while stopping: ${(err as Error).message.split('\n')[0]}`);
      }
    }
  };
  const printer = new LogPrinter();
  const emit = (p: Printed | undefined) => p && opts.print(p);

  try {
    // 1. The control plane.
    let controlPlane: ControlPlane | undefined;
    let kubeconfigPath: string;
    if (opts.kubeconfig) {
      kubeconfigPath = opts.kubeconfig;
      mkdirSync(opts.dir, { recursive: true });
    } else {
      controlPlane = await startControlPlane({ dir: opts.dir, log: opts.progress });
      cleanups.push(() => controlPlane!.stop());
      kubeconfigPath = controlPlane.kubeconfigPath;
    }
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfigPath);
    const server = kc.getCurrentCluster()?.server;
    if (!server) throw new Error(`${kubeconfigPath}: the current context names no cluster`);

    // 2. CRDs: always on the embedded control plane; on a named cluster only with --install.
    const install = !opts.kubeconfig || Boolean(opts.install);
    if (install) {
      opts.progress(`installing CRDs into ${server}`);
      await installCRDs(kc);
    }

    // 3. The webhook's serving certificate (openssl, like cert-manager would issue it).
    const pkiDir = join(opts.dir, 'webhook-pki');
    const ca = await createCA(pkiDir, 'webhook-ca', 'captf-local-webhook-ca');
    const leaf = await createLeaf({
      ca,
      dir: pkiDir,
      name: 'admission',
      cn: 'captf-admission',
      sans: ['IP:127.0.0.1', 'DNS:localhost'],
      usage: 'server',
    });
    const caPem = readFileSync(ca.cert, 'utf8');

    // 4. The functions, from the container's entrypoint, on free ports.
    const baseEnv: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      KUBECONFIG: kubeconfigPath,
      PORT: '0',
      HOST: '127.0.0.1', // local mode: reachable from this machine only
      LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
      ...(process.env.CAPTF_CONSUMER_KINDS ? { CAPTF_CONSUMER_KINDS: process.env.CAPTF_CONSUMER_KINDS } : {}),
    };
    const envs: Record<FunctionName, NodeJS.ProcessEnv> = {
      admission: { ...baseEnv, CAPTF_TLS_CERT_FILE: leaf.cert, CAPTF_TLS_KEY_FILE: leaf.key },
      'mirror-sync': baseEnv,
      'identity-status': baseEnv,
    };
    const functions = {} as Record<FunctionName, RunningFunction>;
    for (const name of FUNCTION_NAMES) {
      opts.progress(`starting ${name}`);
      const fn = await startFunction(name, envs[name], caPem, (l) => {
        opts.onRawLine?.(name, l);
        emit(printer.line(name, l));
      });
      cleanups.push(() => stopProcess(fn.process));
      functions[name] = fn;
    }

    // 5. The webhook registration (never on a remote cluster: it could not reach this machine).
    let webhook = false;
    if (install && isLoopback(server)) {
      const adm = kc.makeApiClient(AdmissionregistrationV1Api);
      const body = webhookConfiguration(functions.admission.url, caPem);
      await adm.deleteValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION }).catch((e: unknown) => {
        if (!isNotFound(e)) throw e;
      });
      await adm.createValidatingWebhookConfiguration({ body });
      webhook = true;
      cleanups.push(async () => {
        // Left behind on a named cluster it would block every identity write (failurePolicy Fail).
        if (opts.kubeconfig)
          await adm.deleteValidatingWebhookConfiguration({ name: WEBHOOK_CONFIGURATION }).catch(() => undefined);
      });
    } else if (install) {
      opts.progress(
        `not registering the webhook: ${server} is not on this machine, so it could not call ${functions.admission.url}`,
      );
    }

    // 6. Deliveries (Trigger-like) to the two event-driven functions.
    const report = (r: {
      sink: string;
      type: string;
      subject: string;
      status: number;
      attempts: number;
      failed: boolean;
      error?: string;
    }) => {
      const fn = r.sink === functions['mirror-sync'].url + '/' ? 'mirror-sync' : 'identity-status';
      emit({
        debug: !r.failed,
        component: 'events',
        subject: fn,
        text: `${r.failed ? 'gave up on' : 'delivered'} ${r.type} ${r.subject} → ${r.status || 'unreachable'} after ${r.attempts} attempt(s)${r.error ? ` (${r.error})` : ''}`,
      });
    };
    const toMirrorSync = new Delivery(`${functions['mirror-sync'].url}/`, {
      onReport: report,
      ...(opts.backoffMs ? { backoffMs: opts.backoffMs } : {}),
    });
    const toIdentityStatus = new Delivery(`${functions['identity-status'].url}/`, {
      onReport: report,
      ...(opts.backoffMs ? { backoffMs: opts.backoffMs } : {}),
    });
    cleanups.push(() => {
      toMirrorSync.stop();
      toIdentityStatus.stop();
    });

    // 7. API events: the real adapter (one per Trigger's worth of resources), or the local source.
    const kinds = consumerKindsFromEnv(process.env);
    const resources = watchedResources(kc, kinds, toMirrorSync, toIdentityStatus);
    await waitForWatchCaches(
      kc,
      resources.map((r) => r.path),
    );
    const mode = opts.eventSource ?? 'auto';
    const adapterBin =
      mode === 'build'
        ? await ensureApiServerSourceAdapter(opts.progress)
        : mode === 'auto'
          ? builtAdapterPath()
          : undefined;
    let eventSource: 'adapter' | 'local';
    if (adapterBin) {
      eventSource = 'adapter';
      const gvr = (Group: string, Version: string, Resource: string) => ({ gvr: { Group, Version, Resource } });
      const sources: [string, string, SourceConfig][] = [
        [
          'captf-objects',
          functions['mirror-sync'].url,
          {
            namespaces: [],
            allNamespaces: true,
            mode: 'Reference',
            resources: [
              ...kinds.map((k) => gvr(k.group, k.version, k.plural)),
              gvr(GROUP, VERSION, IDENTITY_PLURAL),
              gvr('', 'v1', 'namespaces'),
            ],
          },
        ],
        [
          'captf-identities',
          functions['identity-status'].url,
          { namespaces: [], allNamespaces: true, mode: 'Reference', resources: [gvr(GROUP, VERSION, IDENTITY_PLURAL)] },
        ],
      ];
      for (const [name, sink, source] of sources) {
        const adapter: RunningAdapter = await startApiServerSourceAdapter({
          kubeconfigPath,
          sink: `${sink}/`,
          source,
          name,
          onLog: (l) => {
            opts.onRawLine?.(`adapter ${name}`, l);
            emit(adapterLine(name, l));
          },
        });
        cleanups.push(() => adapter.stop());
        // startApiServerSourceAdapter resolves at the first STARTING line, before discovery;
        // the reflectors start after "Starting in … mode".
        const deadline = Date.now() + 30_000;
        while (!adapter.logs.some((l) => /Starting in (resilient|fail-fast) mode/.test(l)) && Date.now() < deadline)
          await new Promise((r) => setTimeout(r, 50));
      }
      // Their first list/watch round trip; objects created before it ends produce no event.
      await new Promise((r) => setTimeout(r, 1000));
    } else {
      eventSource = 'local';
      const local: LocalEventSource = await startLocalEventSource(kc, server, resources, {
        onError: (msg) => emit({ debug: false, component: 'events', subject: '', text: msg }),
      });
      cleanups.push(() => local.stop());
    }

    // 8. A metadata-level watch of mirrors, only to print what happened to them.
    cleanups.push(await watchMirrors(kc, emit));

    // 9. PingSource ticks.
    cleanups.push(schedulePing(toIdentityStatus, PINGS.status, opts.statusEveryMs ?? 5 * 60_000));
    cleanups.push(schedulePing(toMirrorSync, PINGS.resync, opts.resyncEveryMs ?? 10 * 60_000));

    return {
      kubeconfigPath,
      server,
      ...(controlPlane ? { controlPlane } : {}),
      functions,
      eventSource,
      webhook,
      async ping(which) {
        const d = which === 'status' ? toIdentityStatus : toMirrorSync;
        d.send(pingMessage(PINGS[which]));
        await d.idle();
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The adapter's zap JSON lines: errors and warnings are shown, the rest is debug. */
function adapterLine(name: string, raw: string): Printed | undefined {
  if (!raw.trim()) return undefined;
  let level = 'info';
  let msg = raw;
  try {
    const j = JSON.parse(raw) as { level?: string; msg?: string; error?: string };
    level = j.level ?? level;
    msg = `${j.msg ?? raw}${j.error ? ` (${j.error})` : ''}`;
  } catch {
    // keep the raw line
  }
  return {
    debug: !['warn', 'error', 'fatal', 'panic'].includes(level),
    component: 'events',
    subject: `adapter ${name}`,
    text: msg,
  };
}

function mirrorView(s: V1Secret): MirrorView {
  return {
    namespace: s.metadata?.namespace ?? '',
    name: s.metadata?.name ?? '',
    identity: s.metadata?.annotations?.[ANNOTATION_IDENTITY] ?? '?',
    owners: (s.metadata?.ownerReferences ?? []).map((o) => `${o.kind}/${o.name}`).sort(),
    hash: s.metadata?.annotations?.[ANNOTATION_SOURCE_HASH] ?? '',
  };
}

/**
 * Watches Secrets labelled as mirrors and prints created/updated/deleted lines. Only
 * metadata is kept: each object's `data` is dropped as soon as it arrives.
 * @returns a function that stops the watch.
 */
async function watchMirrors(kc: KubeConfig, emit: (p: Printed | undefined) => void): Promise<() => Promise<void>> {
  const core = kc.makeApiClient(CoreV1Api);
  const selector = `${LABEL_MIRRORED}=true`;
  const seen = new Map<string, MirrorView>();
  const strip = (s: V1Secret): V1Secret => ({ metadata: s.metadata ?? {} });
  const informer = makeInformer<V1Secret>(
    kc,
    '/api/v1/secrets',
    async () => {
      const list = await core.listSecretForAllNamespaces({ labelSelector: selector });
      return { ...list, items: list.items.map(strip) } as KubernetesListObject<V1Secret>;
    },
    selector,
  );
  let listed = false;
  let stopped = false;
  const on = (verb: 'add' | 'update' | 'delete') => (s: V1Secret) => {
    const view = mirrorView(s);
    delete (s as { data?: unknown }).data;
    const key = `${view.namespace}/${view.name}`;
    const before = seen.get(key);
    if (verb === 'delete') seen.delete(key);
    else seen.set(key, view);
    if (listed) emit(describeMirrorChange(verb, view, before));
  };
  informer.on('add', on('add'));
  informer.on('update', on('update'));
  informer.on('delete', on('delete'));
  informer.on('error', (err: unknown) => {
    if (stopped) return;
    emit({ debug: true, component: 'mirror', subject: '', text: `watch failed (${describeError(err)}); restarting` });
    setTimeout(() => !stopped && informer.start().catch(() => undefined), 1000).unref();
  });
  await informer.start();
  listed = true;
  return async () => {
    stopped = true;
    await informer.stop();
  };
}

/** Prints a line unless it is debug and debug is off. */
export function printer(
  debug: boolean,
  out: (l: string) => void = (l) => process.stdout.write(l + '\n'),
): (p: Printed) => void {
  return (p) => {
    if (p.debug && !debug) return;
    out(formatLine(p));
  };
}
