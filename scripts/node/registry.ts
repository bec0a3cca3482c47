/**
 * A registry for the test node, as a cluster has one: go-containerregistry's `registry` (tool set
 * `imagebuild`, in memory) runs inside the node's network namespace on a port P, and this
 * machine reaches it on 127.0.0.1:P, so `localhost:P/<repository>` names the same image for
 * `skopeo` here and for the node's containerd there. Both speak plain HTTP to it: containerd
 * through a `hosts.toml`, skopeo with `--dest-tls-verify=false` (Debian's skopeo 1.9 reads no
 * registries.conf but the machine's, which is left alone).
 *
 * The node has no network out. What a cluster would pull from a public registry (Knative's
 * `event_display`, which the manifests name on gcr.io) is pushed here under its upstream
 * repository, and containerd takes that registry's pulls from here (a mirror in its `hosts.toml`,
 * as an air-gapped cluster is set up).
 */
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync, createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { runCommand } from '../lib/command.ts';
import { onLines, stopProcess } from '../lib/process.ts';
import { ensureTool } from '../tools/build.ts';
import type { TestNode } from './node.ts';

/** An image pushed to the registry under its upstream name (`<registry host>/<repository>:<tag>`). */
export interface MirroredImage {
  /** The OCI archive (`npm run image`'s tar). */
  tar: string;
  /** The name manifests use, e.g. `gcr.io/knative-releases/knative.dev/eventing/cmd/event_display:latest`. */
  upstream: string;
}

/** A running node registry. */
export interface NodeRegistry {
  /** `localhost:<port>`: the registry's name on this machine and on the node. */
  host: string;
  /** Its log: one line per request. */
  log: string;
  stop(): Promise<void>;
}

/** Splits `host/path:tag` into the registry host and the rest. Pure. @throws Error without a host part or a tag. */
export function splitUpstream(ref: string): { registry: string; path: string } {
  const slash = ref.indexOf('/');
  const colon = ref.lastIndexOf(':');
  if (slash <= 0 || colon <= ref.lastIndexOf('/') || ref.includes('@'))
    throw new Error(`image ${ref}: expected <registry>/<repository>:<tag>`);
  return { registry: ref.slice(0, slash), path: ref.slice(slash + 1) };
}

/**
 * containerd's `hosts.toml` for `registry`: served by `localhost:<port>` over plain HTTP. For the
 * registry itself (`registry === host`) the server is that address; for an upstream registry the
 * address is its mirror, tried for pulls and tag resolution before the upstream. Pure.
 */
export function hostsToml(registry: string, host: string): string {
  if (registry === host) return `server = "http://${host}"\n`;
  return `server = "https://${registry}"\n\n[host."http://${host}"]\n  capabilities = ["pull", "resolve"]\n`;
}

/**
 * Starts the registry inside `node`, tells containerd how to reach it, and pushes `mirrored`
 * under their upstream names.
 * @param o.dir where its log goes.
 * @throws Error when the registry does not start in 30 s or a push fails (the registry is stopped first).
 */
export async function startNodeRegistry(
  node: TestNode,
  o: { dir: string; mirrored?: readonly MirroredImage[]; log: (line: string) => void },
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
    const registries = new Set([host, ...(o.mirrored ?? []).map((m) => splitUpstream(m.upstream).registry)]);
    for (const r of registries) {
      mkdirSync(join(node.containerd.hostsDir, r), { recursive: true });
      writeFileSync(join(node.containerd.hostsDir, r, 'hosts.toml'), hostsToml(r, host));
    }
    for (const m of o.mirrored ?? []) {
      const to = `docker://${host}/${splitUpstream(m.upstream).path}`;
      o.log(`[registry] ${m.upstream} → ${to.slice('docker://'.length)}`);
      await runCommand('skopeo', ['copy', '-q', '--dest-tls-verify=false', `oci-archive:${m.tar}`, to], { cwd: o.dir });
    }
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
