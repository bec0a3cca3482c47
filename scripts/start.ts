/**
 * `npm start [-- options]`: the whole system on this machine (SPEC §14). Starts an embedded
 * control plane (building it first if needed), installs the CRDs, runs the three functions
 * from the container's entrypoint and wires them as Knative would (./local/system.ts), then
 * prints one line per thing that happens until Ctrl-C, which stops everything it started.
 *
 * Options:
 *   --dir DIR               state folder (default .local/start; wiped on start when embedded)
 *   --status DURATION       identity-status ping interval (default 5m)
 *   --resync DURATION       mirror-sync resync ping interval (default 10m)
 *   --kubeconfig PATH       run against that cluster instead of an embedded control plane
 *   --use-current-context   run against $KUBECONFIG's current context (both must be given)
 *   --install               with a named cluster: also install the CRDs (and the webhook if the API server is local)
 *   --build-adapter         build Knative's ApiServerSource adapter if needed (about 4 minutes once)
 *   --local-events          use the built-in event source even when the adapter is built
 *   --debug                 also print every delivery and every unchanged reconcile
 */
import { delimiter, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { parseDuration } from './local/events.ts';
import { printer, startSystem, type RunningSystem } from './local/system.ts';

const USAGE =
  'usage: npm start -- [--dir DIR] [--status 5m] [--resync 10m] [--kubeconfig PATH | --use-current-context] [--install] [--build-adapter | --local-events] [--debug]';

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
let statusEveryMs: number;
let resyncEveryMs: number;
try {
  statusEveryMs = parseDuration(values.status!);
  resyncEveryMs = parseDuration(values.resync!);
} catch (err) {
  console.error(`${(err as Error).message}\n${USAGE}`);
  process.exit(2);
}

const progress = (l: string) => console.error(l.startsWith('[') ? l : `[start] ${l}`);
let system: RunningSystem | undefined;
let stopping = false;
const shutdown = async (signal: string, code = 0) => {
  if (stopping) return;
  stopping = true;
  console.error(`\n${signal}: stopping the functions, the event source${kubeconfig ? '' : ' and the control plane'}…`);
  await system?.stop();
  console.error('stopped.');
  process.exit(code);
};
process.on('SIGINT', () => void shutdown('SIGINT'));
process.on('SIGTERM', () => void shutdown('SIGTERM'));

try {
  system = await startSystem({
    dir: values.dir ?? (kubeconfig ? '.local/start-external' : '.local/start'),
    kubeconfig,
    install: values.install,
    statusEveryMs,
    resyncEveryMs,
    eventSource: values['build-adapter'] ? 'build' : values['local-events'] ? 'local' : 'auto',
    print: printer(values.debug!),
    progress,
  });
} catch (err) {
  console.error(`npm start failed: ${(err as Error).message}`);
  process.exit(1);
}
if (stopping) {
  // Ctrl-C arrived while starting: shutdown() ran before `system` existed.
  await system.stop();
  process.exit(0);
}

const f = system.functions;
const seconds = ((performance.now() - started) / 1000).toFixed(1);
console.log(`
ready in ${seconds}s — ${system.controlPlane ? 'embedded control plane' : 'cluster'} ${system.server}
  export KUBECONFIG=${system.kubeconfigPath}
  functions: admission ${f.admission.url}/validate (webhook ${system.webhook ? 'registered' : 'NOT registered'}), mirror-sync ${f['mirror-sync'].url}, identity-status ${f['identity-status'].url}
  events: ${system.eventSource === 'adapter' ? "Knative's ApiServerSource adapter" : 'local event source (client-node watches; same CloudEvents as the adapter)'}; pings: status every ${values.status}, resync every ${values.resync}${
    system.controlPlane
      ? `
  try: kubectl apply -f examples/ && kubectl get terraformclusters -A
  users: sign client certificates with ${system.controlPlane.dir}/pki/client-ca.crt and client-ca.key (examples/README.md)`
      : ''
  }
  Ctrl-C stops everything.
`);
