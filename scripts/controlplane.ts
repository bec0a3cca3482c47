/**
 * `npm run controlplane [-- --dir DIR] [--node | --serving]`: runs the local control plane in the
 * foreground and prints `control plane ready: KUBECONFIG=<path>` once /readyz answers. SIGINT
 * and SIGTERM stop every process it started.
 * - `--node` (root): inside a real test node (scripts/node/node.ts) whose kubelet runs pods,
 *   with the product image imported; the kubeconfig still names 127.0.0.1.
 * - `--serving` (root): a cluster to install the product into as the README says: the node with
 *   Knative Serving, Knative Eventing's own installation, cert-manager's stand-in and a registry
 *   (`localhost:<port>` from here and from the node), and nothing of the project's, CRDs included.
 */
import { parseArgs } from 'node:util';
import { stopOnSignal } from './lib/process.ts';
import { startSystem, type RunningSystem } from './system/system.ts';

const { values } = parseArgs({
  options: {
    dir: { type: 'string', default: '.local/controlplane' },
    node: { type: 'boolean', default: false },
    serving: { type: 'boolean', default: false },
  },
});
let system: RunningSystem | undefined;
const signal = stopOnSignal(
  () => system?.stop().then(() => console.error('stopped.')),
  (sig) => console.error(`${sig}: stopping the control plane…`),
  0,
);
const cluster = values.serving
  ? ({ serving: true, events: 'knative', product: false, registry: true } as const)
  : { node: values.node! };
system = await startSystem({ dir: values.dir!, progress: (l) => console.error(l), ...cluster, signal }).catch(
  (err: unknown) => {
    if (signal.aborted) process.exit(130);
    throw err;
  },
);
const cp = system.controlPlane!;
console.log(`control plane ready: KUBECONFIG=${cp.kubeconfigPath}`);
console.error(`  client CA for minting users: ${cp.dir}/pki/client-ca.crt and client-ca.key (CN = user, O = group)`);
if (system.node && !system.registry) {
  console.error(
    `  node ${system.node.namespace.address}: pods run there; the product image is ${system.node.image.ref}`,
  );
  console.error(
    `  (imagePullPolicy: Never); the node's logs: ${system.dir}/node/{kubelet,containerd,kube-proxy,coredns}/`,
  );
} else if (system.node) {
  console.error(
    `  node ${system.node.namespace.address}: pods run there, from images in the registry below; its logs: ${system.dir}/node/`,
  );
}
if (system.registry) {
  const r = system.registry;
  console.error(
    `  Knative Serving, Knative Eventing and cert-manager (a stand-in) run; nothing of captf-credentials is installed`,
  );
  console.error(`  registry: ${r.host} (its log ${r.log}): README "Install on a cluster" with <registry> = ${r.host}`);
  console.error(
    `    after export KUBECONFIG=${cp.kubeconfigPath}; it speaks plain HTTP: skopeo copy --dest-tls-verify=false`,
  );
  console.error(`  kubectl and kustomize: export PATH="$(npm run -s tools -- kubectl kustomize | paste -sd:):$PATH"`);
}
console.error(`  logs: ${cp.dir}/logs/   stop with Ctrl-C`);
