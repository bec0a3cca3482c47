/**
 * containerd inside the test node's namespaces (namespace.ts), as the kubelet will use it: its
 * own root, state and socket under the node's folder, the CRI plugin with runc (cgroupfs), the
 * pause image of `npm run image` as the pinned sandbox image, and the CNI plugins of tool set
 * `node`. Images are imported from `npm run image`'s tars with `ctr`, so no registry is needed;
 * where one is (./registry.ts), its hosts go in `certs.d/<host>/hosts.toml` ({@link Containerd.hostsDir}),
 * which containerd reads at each pull.
 *
 * One setting is this machine's: root here lacks CAP_SYS_RESOURCE, so runc cannot give a
 * container an `oom_score_adj` below containerd's own and every sandbox would fail (`nsexec:
 * failed to update /proc/self/oom_score_adj: Permission denied`); `restrict_oom_score_adj`
 * keeps containers at or above containerd's.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { NodeNamespace } from './namespace.ts';

/** The containerd namespace the kubelet's CRI uses. */
export const K8S_NAMESPACE = 'k8s.io';

/** A running containerd. */
export interface Containerd {
  /** Its gRPC socket (inside the node's folder, so reachable from the host too). */
  socket: string;
  /** The folder of the pod network's CNI configuration (the kubelet's side writes it). */
  cniConfDir: string;
  /** The registry hosts folder (`config_path`): `<host>/hosts.toml` says how to reach `<host>`. */
  hostsDir: string;
  process: ChildProcess;
  /**
   * Runs `ctr` against it, inside the node, in the `k8s.io` namespace.
   * @returns its stdout. @throws Error with its output when it exits non-zero.
   */
  ctr(args: readonly string[]): Promise<string>;
}

/** Options of {@link startContainerd}. */
export interface ContainerdOptions {
  /** The node's folder (containerd's root, state, socket and log go under `containerd/`). */
  dir: string;
  /** Paths of the node's programs (scripts/node/binaries.ts). */
  bin: Record<string, string>;
  /** The pod sandbox image's name (imported before any pod starts). */
  sandboxImage: string;
}

/** containerd's configuration (version 3) for the node. Pure. */
export function containerdConfig(o: { root: string; bin: Record<string, string>; sandboxImage: string }): string {
  const q = (s: string) => JSON.stringify(s);
  return `version = 3
root = ${q(join(o.root, 'root'))}
state = ${q(join(o.root, 'state'))}

[grpc]
  address = ${q(join(o.root, 'containerd.sock'))}
[ttrpc]
  address = ${q(join(o.root, 'containerd.sock.ttrpc'))}

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = ${q(o.sandboxImage)}
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = ${q(join(o.root, 'certs.d'))}
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = ${q(o.bin.runc!)}
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [${q(dirname(o.bin.bridge!))}]
      conf_dir = ${q(join(o.root, 'cni'))}
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
`;
}

/**
 * Starts containerd inside `ns` and waits for its socket.
 * @throws Error with the tail of its log when it exits or its socket does not appear in 30 s.
 */
export async function startContainerd(ns: NodeNamespace, o: ContainerdOptions): Promise<Containerd> {
  const root = join(o.dir, 'containerd');
  mkdirSync(join(root, 'cni'), { recursive: true });
  mkdirSync(join(root, 'certs.d'), { recursive: true });
  const configFile = join(root, 'config.toml');
  writeFileSync(configFile, containerdConfig({ root, bin: o.bin, sandboxImage: o.sandboxImage }));
  const log = openSync(join(root, 'containerd.log'), 'a');
  // The shim finds runc through PATH as well as through BinaryName.
  const env = { ...process.env, PATH: `${dirname(o.bin.runc!)}:${process.env.PATH ?? ''}` };
  const socket = join(root, 'containerd.sock');
  // A restart after a SIGKILL finds the old socket: waiting for it must wait for the new one.
  rmSync(socket, { force: true });
  const child = ns.spawn(o.bin.containerd!, ['--config', configFile], { stdio: ['ignore', log, log], env });
  for (let i = 0; i < 300 && !existsSync(socket); i++) {
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  if (!existsSync(socket)) throw new Error(`containerd did not start; see ${join(root, 'containerd.log')}`);
  const ctr = (args: readonly string[]) =>
    new Promise<string>((resolve, reject) => {
      const c = ns.spawn(o.bin.ctr!, ['--address', socket, '-n', K8S_NAMESPACE, ...args], { env });
      let out = '';
      let err = '';
      c.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      c.stderr!.on('data', (d: Buffer) => (err += d.toString()));
      c.on('exit', (code) =>
        code === 0 ? resolve(out) : reject(new Error(`ctr ${args.join(' ')} exited ${code}: ${err.trim()}`)),
      );
    });
  return { socket, cniConfDir: join(root, 'cni'), hostsDir: join(root, 'certs.d'), process: child, ctr };
}
