/**
 * `npm run controlplane [-- --dir DIR]`: runs the local control plane in the foreground and
 * prints `control plane ready: KUBECONFIG=<path>` once /readyz answers. SIGINT/SIGTERM stop
 * every process it started.
 */
import { parseArgs } from 'node:util';
import { stopOnSignal } from './lib/process.ts';
import { startSystem, type RunningSystem } from './system/system.ts';

const { values } = parseArgs({ options: { dir: { type: 'string', default: '.local/controlplane' } } });
let system: RunningSystem | undefined;
const signal = stopOnSignal(
  () => system?.stop(),
  (sig) => console.error(`${sig}: stopping the control plane…`),
  0,
);
system = await startSystem({ dir: values.dir!, progress: (l) => console.error(l), signal }).catch((err: unknown) => {
  if (signal.aborted) process.exit(130);
  throw err;
});
const cp = system.controlPlane!;
console.log(`control plane ready: KUBECONFIG=${cp.kubeconfigPath}`);
console.error(`  client CA for minting users: ${cp.dir}/pki/client-ca.crt and client-ca.key (CN = user, O = group)`);
console.error(`  logs: ${cp.dir}/logs/   stop with Ctrl-C`);
