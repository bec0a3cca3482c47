/**
 * `npm start [-- options]`: the whole system on this machine (SPEC §14). Builds what is
 * missing (the control plane, Knative's ApiServerSource adapter and Broker data plane), starts
 * an embedded control plane, installs the CRDs, runs the four functions from the container's
 * entrypoint and wires them as Knative does, every event through Knative's real Broker
 * (./system/system.ts), then prints one line per thing that happens until Ctrl-C, which stops
 * everything it started.
 *
 * Options:
 *   --dir DIR               state folder (default .local/start; wiped on start when embedded)
 *   --status DURATION       identity-status PingSource interval (default 5m)
 *   --resync DURATION       mirror-sync resync PingSource interval (default 10m)
 *   --kubeconfig PATH       run against that cluster instead of an embedded control plane (needs --install)
 *   --use-current-context   run against $KUBECONFIG's current context (both must be given)
 *   --install               with a named cluster: allow writing into it (CRDs, the Broker and its
 *                           Triggers and PingSources, the webhook if the API server is local)
 *   --serving               on a real node (as root) with Knative Serving and Knative Eventing's own
 *                           installation: the manifests' Knative Services from the product image, their
 *                           Broker, Triggers and sources as Knative runs them (docs/deploy-knative.md)
 *   --observability         also start Prometheus (with the shipped alert rules) and Jaeger (on this
 *                           machine; with --serving inside the node), push the functions' and Knative's
 *                           own metrics and traces to them, and print where to look (docs/observability.md)
 *   --debug                 also print unchanged reconciles and Knative's informational lines
 * `--build-adapter` and `--local-events` (earlier versions) are accepted and ignored with a note.
 */
import { rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { delimiter, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { cronSchedule, parseDuration } from './local/events.ts';
import { stopOnSignal } from './lib/process.ts';
import { printer } from './local/print.ts';
import { startObservability, type Observability } from './observability/stack.ts';
import { FUNCTION_NAMES, startSystem, type RunningSystem } from './system/system.ts';

const USAGE =
  'usage: npm start -- [--dir DIR] [--status 5m] [--resync 10m] [--kubeconfig PATH | --use-current-context] [--install] [--serving] [--observability] [--debug]\n' +
  '  --status/--resync: an interval a PingSource (cron) schedule can express: seconds dividing a minute (sub-minute is for\n' +
  '  local use only), minutes dividing an hour, hours dividing a day. A named cluster needs --install: the Broker is written into it.';

const started = performance.now();
let values;
try {
  ({ values } = parseArgs({
    options: {
      dir: { type: 'string' },
      status: { type: 'string', default: '5m' },
      resync: { type: 'string', default: '10m' },
      kubeconfig: { type: 'string' },
      'use-current-context': { type: 'boolean', default: false },
      install: { type: 'boolean', default: false },
      'build-adapter': { type: 'boolean', default: false },
      'local-events': { type: 'boolean', default: false },
      debug: { type: 'boolean', default: false },
      serving: { type: 'boolean', default: false },
      observability: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  }));
} catch (err) {
  console.error(`${(err as Error).message}\n${USAGE}`);
  process.exit(2);
}
if (values.help) {
  console.log(USAGE);
  process.exit(0);
}

// Never touch a cluster the user did not name: KUBECONFIG alone is not enough.
// npm runs scripts from the package root; relative paths mean the caller's directory.
const callerDir = process.env.INIT_CWD ?? process.cwd();
let kubeconfig = values.kubeconfig ? resolve(callerDir, values.kubeconfig) : undefined;
if (!kubeconfig && values['use-current-context']) {
  // KUBECONFIG may list several files; only the first is used (it must hold the context).
  const first = process.env.KUBECONFIG?.split(delimiter).find(Boolean);
  if (!first) {
    console.error('--use-current-context needs KUBECONFIG to be set');
    process.exit(2);
  }
  kubeconfig = resolve(callerDir, first);
}
if (values.install && !kubeconfig)
  console.error('(--install only matters with --kubeconfig; the embedded control plane always gets the CRDs)');
if (values['build-adapter'] || values['local-events'])
  console.error(
    "(--build-adapter and --local-events are no longer needed: npm start builds Knative's adapter and data plane when missing, and events always come from the adapter through the Broker)",
  );
if (kubeconfig && values.serving) {
  console.error(
    `--serving starts its own node and control plane; it does not run against a cluster you name\n${USAGE}`,
  );
  process.exit(2);
}
if (kubeconfig && !values.install) {
  console.error(
    `--kubeconfig and --use-current-context need --install: events flow through Knative's Broker, which runs here against that cluster and writes its Broker, Triggers, PingSources and Knative Eventing's CRDs into it\n${USAGE}`,
  );
  process.exit(2);
}
/** Parses `--<name>` as a duration that a PingSource schedule can express; exits 2 otherwise. */
function pingInterval(name: 'status' | 'resync', text: string): number {
  try {
    const ms = parseDuration(text);
    cronSchedule(ms);
    return ms;
  } catch (err) {
    console.error(`--${name} ${text}: ${(err as Error).message}\n${USAGE}`);
    process.exit(2);
  }
}
const statusEveryMs = pingInterval('status', values.status!);
const resyncEveryMs = pingInterval('resync', values.resync!);

const progress = (l: string) => console.error(l.startsWith('[') ? l : `[start] ${l}`);
let system: RunningSystem | undefined;
let observability: Observability | undefined;
const signal = stopOnSignal(
  // While it starts there is nothing to stop yet (undefined): the start is aborted instead.
  () =>
    system &&
    system
      .stop()
      .then(() => observability?.stop())
      .then(() => console.error('stopped.')),
  (sig) =>
    console.error(
      `\n${sig}: stopping the adapter, the Broker's data plane, the functions${kubeconfig ? '' : values.serving ? ', Knative Serving, the node and the control plane' : ' and the control plane'}…`,
    ),
  0,
);

const dir = values.dir ? resolve(callerDir, values.dir) : kubeconfig ? '.local/start-external' : '.local/start';
try {
  // With --serving the system starts them inside the node, where the pods reach them.
  if (values.observability && !values.serving) {
    progress('starting Prometheus and Jaeger (docs/observability.md)');
    // Beside the state folder, not in it: the control plane wipes that folder as it starts.
    observability = await startObservability({ dir: `${dir}-observability`, log: progress });
  }
  const otel = observability?.functionEnv;
  system = await startSystem({
    dir,
    cluster: kubeconfig ? { kubeconfig, install: values.install ?? false } : undefined,
    ...(values.serving
      ? { serving: true, events: 'knative' as const, observability: values.observability ?? false }
      : { functions: 'source' as const, webhook: true, events: 'broker' as const }),
    pings: { statusEveryMs, resyncEveryMs },
    ...(otel ? { env: Object.fromEntries(FUNCTION_NAMES.map((n) => [n, otel])) } : {}),
    ...(observability ? { knativeObservability: observability.knative } : {}),
    prepareCaller: true,
    print: printer(values.debug!),
    progress,
    signal,
  });
} catch (err) {
  // Interrupted while starting: what had started is stopped already.
  await observability?.stop();
  if (signal.aborted) process.exit(130);
  console.error(`npm start failed: ${(err as Error).message}`);
  process.exit(1);
}

const f = system.functions;
const broker = system.broker!;
// One kubeconfig path in every embedded mode (the docs' `export KUBECONFIG=…/.local/start/admin.kubeconfig`):
// with --serving the control plane lives in the node's folder, and an earlier run's file would name a dead server.
const usual = join(system.dir, 'admin.kubeconfig');
if (system.controlPlane && resolve(system.kubeconfigPath) !== resolve(usual)) {
  rmSync(usual, { force: true });
  symlinkSync(resolve(system.kubeconfigPath), usual);
}
const seconds = ((performance.now() - started) / 1000).toFixed(1);
if (system.serving) {
  const svc = system.serving;
  const ca = join(system.dir, 'cluster-local-ca.crt');
  writeFileSync(ca, svc.caPem);
  // curl keeps the address's name (Host and TLS's SNI, what Traefik routes by) and connects to Traefik's forward.
  const curl = `curl --cacert ${ca} --connect-to ::127.0.0.1:${svc.gateway}`;
  console.log(`
ready in ${seconds}s — a node with Knative Serving (${svc.sources.join(', ')}); embedded control plane ${system.server}
  export KUBECONFIG=${system.kubeconfigPath}
  kubectl get ksvc,pods -n captf-system          (functions at zero have no pod: an event, a ping or a prepare starts one)
  functions: ${Object.entries(svc.urls)
    .map(([n, u]) => `${n} ${u}`)
    .join(', ')}
  from this machine: ${curl} https://<name>.captf-system.svc.cluster.local/healthz (Traefik, the KIngress; cluster-local TLS)
  webhook: registered as shipped (service captf-admission:443 through Knative's gateway; its caBundle from cert-manager's stand-in)
  autoscaler: test windows (stable window and scale-to-zero grace 6 s)
  events: Knative Eventing on the node: the ApiServerSource's adapter pod → Broker captf → Triggers → the Knative Services; status every ${values.status}, resync every ${values.resync}
  broker: ${broker.url} (from this machine; dead letters go to captf-dead-letters' log)${
    system.prepareCaller
      ? `
  prepare (as the provider's manager): ${curl} -H "Authorization: Bearer $(kubectl create token ${system.prepareCaller.name} -n ${system.prepareCaller.namespace} --audience captf-mirror-sync)" -H 'content-type: application/json' -d '{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta2","kind":"TerraformCluster","namespace":"team-a","name":"prod"}' ${svc.urls['captf-mirror-sync']}/prepare`
      : ''
  }
  users: sign client certificates with ${system.controlPlane!.dir}/pki/client-ca.crt and client-ca.key (examples/README.md: set D=${system.controlPlane!.dir})
  try: kubectl apply -f examples/ && kubectl get pods -n captf-system -w${receiversLines(system.observability, `kubectl logs -n captf-system -l serving.knative.dev/service=captf-mirror-sync -c mirror-sync`)}
  Ctrl-C stops everything.
`);
} else
  console.log(`
ready in ${seconds}s — ${system.controlPlane ? 'embedded control plane' : 'cluster'} ${system.server}
  export KUBECONFIG=${system.kubeconfigPath}
  functions: admission ${f.admission.url}/validate (webhook ${system.webhook ? 'registered' : 'NOT registered'}), mirror-sync ${f['mirror-sync'].url}, identity-status ${f['identity-status'].url}, dead-letters ${f['dead-letters'].url}
  events: Knative's ApiServerSource adapter → Broker captf (ingress, filter, in-memory channel) → Triggers; pings: mtping, status every ${values.status} (${broker.schedules.status}), resync every ${values.resync} (${broker.schedules.resync})
  broker: ${broker.url} (dead letters print as dead-letters lines)${
    system.controlPlane
      ? `
  try: kubectl apply -f examples/ && kubectl get terraformclusters -A${
    system.prepareCaller
      ? `
  prepare (as the provider's manager): curl -H "Authorization: Bearer $(kubectl create token ${system.prepareCaller.name} -n ${system.prepareCaller.namespace} --audience captf-mirror-sync)" -H 'content-type: application/json' -d '{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta2","kind":"TerraformCluster","namespace":"team-a","name":"prod"}' ${f['mirror-sync'].url}/prepare`
      : ''
  }
  users: sign client certificates with ${system.controlPlane.dir}/pki/client-ca.crt and client-ca.key (examples/README.md)`
      : ''
  }${receiversLines(observability, join(system.dir, 'logs'))}
  Ctrl-C stops everything.
`);

/** The banner's lines about the receivers, when they run; `logs` says where the JSON log lines are. */
function receiversLines(o: Observability | undefined, logs: string): string {
  if (!o) return '';
  return `
  metrics: Prometheus ${o.prometheus.url} (the shipped alerts under /alerts; PromQL such as sum by (captf_write, captf_result) (captf_mirror_writes_total))
  traces: Jaeger ${o.jaeger.url} (service captf-mirror-sync; Knative's spans under its own services; a trace_id is on each JSON log line: ${logs})
  dashboard: import manifests/components/observability/dashboard.json into a Grafana that reads ${o.prometheus.url}`;
}
