/**
 * `npm run sweep` (root): removes what test nodes of any folder left on this machine once
 * nothing owns them (scripts/node/namespace.ts `sweepNodes`): their processes (the node's
 * programs, containerd's shims, the containers found by the node's cgroups) and their cgroup
 * folders in every hierarchy. Nodes still running, or still being started or stopped, are
 * left alone and named. Every node start sweeps the same way; this is for a machine where
 * none will start soon.
 * Prints one line per node swept or left running. Exit code 0, or 1 naming what could not be
 * removed (and 2 without root).
 */
import { sweepNodes } from './node/namespace.ts';

if (process.getuid?.() !== 0) {
  console.error('npm run sweep needs root: test nodes run as root, and so do their processes and cgroups');
  process.exit(2);
}
const { swept, running, failed } = await sweepNodes();
for (const node of swept) console.log(`swept ${node}`);
for (const dir of running) console.log(`left running: the node from ${dir} (something still owns it)`);
for (const why of failed) console.error(`could not sweep ${why}`);
if (!swept.length && !failed.length) console.log('nothing to sweep');
process.exit(failed.length ? 1 : 0);
