/**
 * `npm run controlplane [-- --dir DIR]`: runs the local control plane in the foreground and
 * prints `control plane ready: KUBECONFIG=<path>` once /readyz answers. SIGINT/SIGTERM stop
 * every process it started.
 */
import { parseArgs } from 'node:util';
import { startSystem } from './system/system.ts';

const { values } = parseArgs({ options: { dir: { type: 'string', default: '.local/controlplane' } } });
const system = await startSystem({ dir: values.dir!, progress: (l) => console.error(l) });
const cp = system.controlPlane!;
console.log(`control plane ready: KUBECONFIG=${cp.kubeconfigPath}`);
console.error(`  client CA for minting users: ${cp.dir}/pki/client-ca.crt and client-ca.key (CN = user, O = group)`);
console.error(`  logs: ${cp.dir}/logs/   stop with Ctrl-C`);

let stopping = false;
const shutdown = async (signal: string) => {
  if (stopping) return;
  stopping = true;
  console.error(`${signal}: stopping the control plane…`);
  await system.stop();
  process.exit(0);
};
process.on('SIGINT', () => void shutdown('SIGINT'));
process.on('SIGTERM', () => void shutdown('SIGTERM'));
