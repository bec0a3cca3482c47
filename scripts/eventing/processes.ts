/**
 * The four processes of Knative Eventing's broker data plane (scripts/eventing/build.ts builds
 * them; scripts/eventing/dataplane.ts wires them): their ports, environment, start, readiness,
 * kill and restart. Upstream binds every interface, so each port is chosen free on all of them
 * and checked again before the start, and a process that logs `address already in use` fails
 * it (docs/eventing-dataplane.md "Ports, interfaces, several data planes").
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer as createHttpServer } from 'node:http';
import { connect, createServer, type AddressInfo } from 'node:net';
import { freePort } from '../lib/ports.ts';
import { isRunning, onLines, stopProcess } from '../lib/process.ts';
import { IMC_PORT_ENV, type EventingBinaries, type EventingComponent } from './build.ts';
import { sleep } from '../lib/wait.ts';

/** The ports of one data plane: each component's HTTP and HTTPS servers and its pprof server. */
export interface DataPlanePorts {
  http: Record<Exclude<EventingComponent, 'mtping'>, number>;
  https: Record<Exclude<EventingComponent, 'mtping'>, number>;
  profiling: Record<EventingComponent, number>;
}

/**
 * Checks that `port` can be bound on every interface right now.
 * @throws Error `port <n> for <what> is taken (…): another process listens there` otherwise.
 */
export function assertPortFree(port: number, what: string): Promise<void> {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', (err: NodeJS.ErrnoException) =>
      rej(new Error(`port ${port} for ${what} is taken (${err.code}): another process listens there`)),
    );
    srv.listen(port, () => srv.close(() => res()));
  });
}

/** Ten distinct ports, each free on every interface (the processes bind all of them). */
export async function choosePorts(): Promise<DataPlanePorts> {
  const seen = new Set<number>();
  const next = async (): Promise<number> => {
    for (;;) {
      const p = await freePort(null);
      if (!seen.has(p)) return (seen.add(p), p);
    }
  };
  const three = async () => ({ ingress: await next(), filter: await next(), dispatcher: await next() });
  const http = await three();
  const https = await three();
  return { http, https, profiling: { ...(await three()), mtping: await next() } };
}

/** Every port of `component`, named for error messages. */
function portsOf(component: EventingComponent, ports: DataPlanePorts): [number, string][] {
  const out: [number, string][] = [[ports.profiling[component], `${component}'s PROFILING_PORT`]];
  if (component !== 'mtping')
    out.push([ports.http[component], `${component}'s HTTP server`], [ports.https[component], `${component}'s HTTPS`]);
  return out;
}

/** What every component's environment is made of. */
export interface EnvContext {
  kubeconfigPath: string;
  systemNamespace: string;
  ports: DataPlanePorts;
  /** `HTTPS_PROXY` of every component: a {@link startRefusingProxy}'s URL. */
  httpsProxy?: string;
  /** `NO_PROXY`: the API server's host (Go never proxies loopback addresses anyway). */
  noProxy?: string;
  /** Added to every component's environment last (e.g. `GODEBUG: 'netdns=go+2'`). */
  extraEnv?: Readonly<Record<string, string>>;
}

/** Environment variables only one component reads (upstream config/…/deployments/*.yaml). */
function ownEnv(component: EventingComponent, { systemNamespace: ns, ports }: EnvContext): NodeJS.ProcessEnv {
  const { http, https } = ports;
  switch (component) {
    case 'ingress':
      return { NAMESPACE: ns, INGRESS_PORT: String(http.ingress), INGRESS_PORT_HTTPS: String(https.ingress) };
    case 'filter':
      return { NAMESPACE: ns, FILTER_PORT: String(http.filter), FILTER_PORT_HTTPS: String(https.filter) };
    case 'dispatcher':
      return {
        MAX_IDLE_CONNS: '1000',
        MAX_IDLE_CONNS_PER_HOST: '1000',
        [IMC_PORT_ENV.http]: String(http.dispatcher),
        [IMC_PORT_ENV.https]: String(https.dispatcher),
      };
    case 'mtping':
      // K_NO_SHUTDOWN_AFTER=59: exit at once on SIGTERM (upstream waits for the next minute
      // when the signal comes after second 55, so that no tick is lost during a rollout).
      return {
        NAMESPACE: ns,
        K_LOGGING_CONFIG: '',
        K_OBSERVABILITY_CONFIG: '{}',
        K_LEADER_ELECTION_CONFIG: '',
        K_NO_SHUTDOWN_AFTER: '59',
        K_SINK_TIMEOUT: '-1',
      };
  }
}

/**
 * The whole environment of one component (nothing else is inherited): the kubeconfig, the
 * system namespace (ConfigMaps and leader-election Leases live there), a pod name unique to
 * this process, the ports, what upstream's Deployment sets (config/brokers/mt-channel-broker,
 * config/channels/in-memory-channel, config/core/deployments/pingsource-mt-adapter.yaml), and
 * `HTTPS_PROXY`/`NO_PROXY` when given (see {@link startRefusingProxy}).
 */
export function componentEnv(component: EventingComponent, ctx: EnvContext): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    KUBECONFIG: ctx.kubeconfigPath,
    SYSTEM_NAMESPACE: ctx.systemNamespace,
    POD_NAME: `captf-${component}-${process.pid}`,
    CONTAINER_NAME: component,
    CONFIG_LOGGING_NAME: 'config-logging',
    CONFIG_OBSERVABILITY_NAME: 'config-observability',
    METRICS_DOMAIN: 'knative.dev/internal/eventing',
    PROFILING_PORT: String(ctx.ports.profiling[component]),
    ...(ctx.httpsProxy ? { HTTPS_PROXY: ctx.httpsProxy } : {}),
    ...(ctx.noProxy ? { NO_PROXY: ctx.noProxy } : {}),
    ...ownEnv(component, ctx),
    ...ctx.extraEnv,
  };
}

/** A running {@link startRefusingProxy}. */
export interface RefusingProxy {
  /** `http://127.0.0.1:<port>`, for `HTTPS_PROXY`. */
  url: string;
  /** Each `host:port` the processes asked it to reach (at most 1000, oldest dropped). */
  refused: string[];
  /** Stops listening and drops open connections. */
  close(): Promise<void>;
}

/**
 * An HTTP proxy on 127.0.0.1 that refuses everything (403) and records what was asked, for the
 * processes' `HTTPS_PROXY`. Why: at start, the ingress, filter and dispatcher each fetch
 * `https://kubernetes.default.svc/.well-known/openid-configuration` (knative.dev/eventing
 * pkg/auth/verifier.go NewVerifier → initOIDCProvider, the compiled-in default of
 * pkg/apis/feature/features.go DefaultOIDCDiscoveryBaseURL, read before the
 * `config-features` ConfigMap is), whether or not OIDC is enabled. Outside a cluster that name
 * would go to the host's DNS server; through a proxy Go resolves nothing (the CONNECT carries
 * the name) and the request fails here, on loopback, as it fails without one (upstream logs
 * "could not initialize provider", harmless with OIDC off). Go never proxies loopback
 * addresses (`net/http` ProxyFromEnvironment), so the API server on 127.0.0.1 and the
 * local sinks are reached directly.
 */
export async function startRefusingProxy(): Promise<RefusingProxy> {
  const refused: string[] = [];
  const note = (target: string | undefined) => {
    refused.push(target ?? '');
    if (refused.length > 1000) refused.shift();
  };
  const answer = 'captf: this data plane reaches nothing off the machine (scripts/eventing/processes.ts)\n';
  const server = createHttpServer((req, res) => {
    note(req.url);
    res.writeHead(403, { 'content-type': 'text/plain' }).end(answer);
  });
  server.on('connect', (req, socket) => {
    note(req.url);
    socket.on('error', () => undefined);
    socket.end(`HTTP/1.1 403 Forbidden\r\ncontent-length: ${answer.length}\r\nconnection: close\r\n\r\n${answer}`);
  });
  await new Promise<void>((res, rej) => server.once('error', rej).listen(0, '127.0.0.1', () => res()));
  server.unref();
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    refused,
    close: () =>
      new Promise((res) => {
        server.closeAllConnections();
        server.close(() => res());
      }),
  };
}

/** At most this many log lines are kept per component. */
const MAX_LOG_LINES = 5000;

/** One running (or stopped) component. */
export interface ComponentProcess {
  child: ChildProcess;
  /** Resolves when it exited. */
  exited: Promise<void>;
  /** Set when a line says a port it serves on is taken. */
  portError?: string;
}

/** Options of {@link spawnComponent}. */
export interface SpawnOptions {
  bins: EventingBinaries;
  env: EnvContext;
  /** The component's log, appended to (the oldest lines dropped past 5000). */
  logs: string[];
  onLog?: (component: EventingComponent, line: string) => void;
}

/**
 * Starts one component after checking its ports are free; it is SIGKILLed if this process
 * exits first.
 * @throws Error when one of its ports is taken.
 */
export async function spawnComponent(component: EventingComponent, opts: SpawnOptions): Promise<ComponentProcess> {
  for (const [port, what] of portsOf(component, opts.env.ports)) await assertPortFree(port, what);
  const child = spawn(opts.bins[component], [], {
    env: componentEnv(component, opts.env),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  const exited = new Promise<void>((r) => child.once('exit', () => (process.off('exit', killOnExit), r())));
  const proc: ComponentProcess = { child, exited };
  const onLine = (line: string) => {
    opts.logs.push(line);
    if (opts.logs.length > MAX_LOG_LINES) opts.logs.shift();
    // Only the ports it serves on count: a taken PROFILING_PORT (free when chosen, an outgoing
    // connection's ephemeral port since) shuts down the pprof server alone, and nothing here uses it.
    if (line.includes('address already in use') && !line.includes('Profiling server')) proc.portError ??= line;
    opts.onLog?.(component, line);
  };
  onLines(child.stdout!, onLine);
  onLines(child.stderr!, onLine);
  return proc;
}

/** True once something accepts TCP connections on 127.0.0.1:`port`. */
function accepts(port: number): Promise<boolean> {
  return new Promise((res) => {
    const s = connect({ port, host: '127.0.0.1' });
    s.once('connect', () => (s.destroy(), res(true)));
    s.once('error', () => res(false));
  });
}

/**
 * Waits until the component listens on its HTTP port (mtping: until it ran for a moment),
 * failing fast when it exits or reports a taken port.
 * @throws Error `<component> exited (…)`, `… address already in use …` or a timeout, with its
 *   last log lines.
 */
export async function waitListening(
  component: EventingComponent,
  proc: ComponentProcess,
  { ports, logs, deadline }: { ports: DataPlanePorts; logs: string[]; deadline: number },
): Promise<void> {
  const port = component === 'mtping' ? undefined : ports.http[component];
  const fail = (why: string) => new Error(`${component} ${why}:\n${logs.slice(-15).join('\n')}`);
  for (const t0 = Date.now(); ; await sleep(100)) {
    if (!isRunning(proc.child)) throw fail(`exited (${proc.child.exitCode ?? proc.child.signalCode})`);
    if (proc.portError) throw fail(`could not bind a port: ${proc.portError}`);
    if (port === undefined ? Date.now() - t0 > 500 : await accepts(port)) return;
    if (Date.now() > deadline) throw fail(`did not listen on ${port} in time`);
  }
}

/**
 * Stops a component: SIGTERM, then SIGKILL after `graceMs`; resolves once it exited.
 * Upstream's servers drain on SIGTERM (they keep answering until no request came for a quiet
 * period), hence the short default grace.
 */
export const stopComponent = (proc: ComponentProcess, graceMs = 3000): Promise<void> =>
  stopProcess(proc.child, graceMs);
