/**
 * `npm run controlplane [-- --dir DIR] [--node]`: runs the local control plane in the
 * foreground and prints `control plane ready: KUBECONFIG=<path>` once /readyz answers. With
 * `--node` (root), inside a real test node (scripts/node/node.ts) whose kubelet runs pods, with
 * the product image imported; the kubeconfig still names 127.0.0.1. SIGINT/SIGTERM stop every
 * process it started.
 */
import { parseArgs } from 'node:util';
import { stopOnSignal } from './lib/process.ts';
import { startSystem, type RunningSystem } from './system/system.ts';

const { values } = parseArgs({
  options: { dir: { type: 'string', default: '.local/controlplane' }, node: { type: 'boolean', default: false } },
});
let system: RunningSystem | undefined;
const signal = stopOnSignal(
  () => system?.stop(),
  (sig) => console.error(`${sig}: stopping the control plane…`),
  0,
);
system = await startSystem({ dir: values.dir!, progress: (l) => console.error(l), node: values.node!, signal }).catch(
  (err: unknown) => {
    if (signal.aborted) process.exit(130);
    throw err;
  },
);
const cp = system.controlPlane!;
console.log(`control plane ready: KUBECONFIG=${cp.kubeconfigPath}`);
console.error(`  client CA for minting users: ${cp.dir}/pki/client-ca.crt and client-ca.key (CN = user, O = group)`);
if (system.node) {
  console.error(
    `  node ${system.node.namespace.address}: pods run there; the product image is ${system.node.image.ref}`,
  );
  console.error(
    `  (imagePullPolicy: Never); the node's logs: ${system.dir}/node/{kubelet,containerd,kube-proxy,coredns}/`,
  );
}
console.error(`  logs: ${cp.dir}/logs/   stop with Ctrl-C`);
