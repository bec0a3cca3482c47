/**
 * A process that owns a test node, for the crash test (test/integration/node-stop.test.ts):
 * starts the node in the folder given as its argument, runs one pod from the product image,
 * prints one JSON line `{ "pod": "<name>" }` once the pod runs, and then waits to be killed.
 */
import { startNode } from '../../scripts/node/node.ts';
import { runProductPod } from './node.ts';

const dir = process.argv[2];
if (!dir) throw new Error('usage: node-owner.ts <folder>');
const node = await startNode({ dir, log: (l) => process.stderr.write(`${l}\n`) });
const name = 'crash';
await runProductPod(node.controlPlane.kubeconfigPath, node.image.ref, name);
process.stdout.write(`${JSON.stringify({ pod: name })}\n`);
setInterval(() => undefined, 1 << 30);
