/**
 * A node test file as `npm test` runs one, for the interrupted run of
 * test/integration/node-stop.test.ts: its world is a node started the way node files start
 * theirs ({@link nodeWorld}, at the file's top), one pod from the product image runs there, and
 * then the file writes the node's folder to the file `CAPTF_NODE_FILE_READY` names and waits
 * for the run to be interrupted.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { it } from 'node:test';
import { nodeWorld, runProductPod } from './node.ts';

const ready = process.env.CAPTF_NODE_FILE_READY;
if (!ready) throw new Error('CAPTF_NODE_FILE_READY must name the file to write once the pod runs');
const { system, work } = await nodeWorld('node-file', { node: true });

it('holds a node with a running pod until the run is interrupted', async () => {
  await runProductPod(system.controlPlane!.kubeconfigPath, system.node!.image.ref, 'held');
  writeFileSync(ready, join(work, 'node'));
  await new Promise(() => setInterval(() => undefined, 1 << 30));
});
