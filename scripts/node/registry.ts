/**
 * A registry for the test node, as a cluster has one: go-containerregistry's `registry` (tool set
 * `imagebuild`, in memory) runs inside the node's network namespace on a port P, and this
 * machine reaches it on 127.0.0.1:P, so `localhost:P/<repository>` names the same image for
 * `skopeo` here and for the node's containerd there. Both speak plain HTTP to it: containerd
 * through a `hosts.toml`, skopeo with `--dest-tls-verify=false` (Debian's skopeo 1.9 reads no
 * registries.conf but the machine's, which is left alone).

 */
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync, createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { onLines, stopProcess } from '../lib/process.ts';
import { ensureTool } from '../tools/build.ts';
import type { TestNode } from './node.ts';

/** A running node registry. */
export interface NodeRegistry {
  /** `localhost:<port>`: the registry's name on this machine and on the node. */
  host: string;
  /** Its log: one line per request. */
  log: string;
  stop(): Promise<void>;
}

/** containerd's `hosts.toml` for the registry at `host` (`localhost:<port>`): plain HTTP. Pure. */
export const hostsToml = (host: string): string => `server = "http://${host}"\n`;

/**
 * Starts the registry inside `node` and tells containerd how to reach it.
 * @param o.dir where its log goes.
 * @throws Error when the registry does not start in 30 s (it is stopped first).
 */
export async function startNodeRegistry(
  node: TestNode,
  o: { dir: string; log: (line: string) => void },
): Promise<NodeRegistry> {
  const bin = await ensureTool('imagebuild', 'registry', o.log);
  mkdirSync(o.dir, { recursive: true });
  const port = await node.namespace.forwardSamePort('127.0.0.1');
  const host = `localhost:${port}`;
  const log = join(o.dir, 'registry.log');
  const out = createWriteStream(log, { flags: 'a' });
  const child = node.namespace.spawn(bin, ['-port', String(port)], { stdio: ['ignore', 'pipe', 'pipe'] });
  const stop = async () => {
    await stopProcess(child, 2000);
    out.end();
  };
  try {
    await listening(child, out);
    mkdirSync(join(node.containerd.hostsDir, host), { recursive: true });
    writeFileSync(join(node.containerd.hostsDir, host, 'hosts.toml'), hostsToml(host));
    return { host, log, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Resolves when the registry says it serves; its output goes to `out`. */
function listening(child: ChildProcess, out: NodeJS.WritableStream): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the node registry did not start in 30 s')), 30_000);
    for (const stream of [child.stdout!, child.stderr!])
      onLines(stream, (l) => {
        out.write(`${l}\n`);
        if (/serving on port \d+/.test(l)) {
          clearTimeout(timer);
          resolve();
        }
      });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the node registry exited ${code}`));
    });
  });
}
