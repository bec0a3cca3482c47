/**
 * A process that owns a test node, for the crash test (test/integration/node-crash.test.ts):
 * starts the node in the folder given as its argument, runs one pod from the product image,
 * prints one JSON line `{ "pod": "<name>" }` once the pod runs, and then waits to be killed.
 */
import { CoreV1Api } from '@kubernetes/client-node';
import { loadKubeConfig } from '../../functions/lib/kube.ts';
import { eventually } from '../../scripts/lib/wait.ts';
import { startNode } from '../../scripts/node/node.ts';

const dir = process.argv[2];
if (!dir) throw new Error('usage: node-owner.ts <folder>');
const node = await startNode({ dir, log: (l) => process.stderr.write(`${l}\n`) });
const core = loadKubeConfig(node.controlPlane.kubeconfigPath).makeApiClient(CoreV1Api);
const name = 'crash';
await core.createNamespacedPod({
  namespace: 'default',
  body: {
    metadata: { name },
    spec: {
      securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532 },
      containers: [{ name: 'mirror-sync', image: node.image.ref, imagePullPolicy: 'Never', args: ['mirror-sync'] }],
    },
  },
});
await eventually(
  'the pod to run',
  async () => (await core.readNamespacedPod({ namespace: 'default', name })).status?.phase === 'Running',
  180_000,
  500,
);
process.stdout.write(`${JSON.stringify({ pod: name })}\n`);
setInterval(() => undefined, 1 << 30);
