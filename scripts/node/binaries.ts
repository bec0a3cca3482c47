/**
 * The test node's programs (tool set `node` of scripts/tools/registry.ts): the kubelet,
 * kube-proxy and kube-scheduler, containerd with its runc shim and ctr, runc with seccomp, the
 * CNI plugins of the pod network, and a trimmed CoreDNS. Built through the Go module proxy on
 * first use (about 3.5 minutes on two cores once the control plane's build has warmed Go's
 * cache) and cached in `.cache/node/`.
 */
import { dirname, join } from 'node:path';
import { ensureTool } from '../tools/build.ts';
import { TOOLS } from '../tools/registry.ts';

/** The CNI plugins the node's pod network uses; containerd's CRI finds them in one folder. */
export const CNI_PLUGINS = ['bridge', 'host-local', 'loopback', 'portmap'] as const;

/** The CoreDNS plugins cluster DNS needs (scripts/tools/go/coredns/main.go links them). */
export const COREDNS_PLUGINS = ['bind', 'cache', 'errors', 'health', 'kubernetes', 'log', 'loop', 'ready', 'reload'];

/**
 * Finds or builds the node's programs.
 * @returns the path of each, by name (all in one folder, which is also the CNI plugin folder).
 * @throws Error when the build fails (with the tail of the Go output).
 */
export async function nodeBinaries(log?: (line: string) => void): Promise<Record<string, string>> {
  const bin = dirname(await ensureTool('node', undefined, log));
  const names = TOOLS.node.flatMap((t) => Object.keys(t.binaries));
  return Object.fromEntries(names.map((n) => [n, join(bin, n)]));
}
