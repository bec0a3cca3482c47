/**
 * The test node's Service network: kube-proxy in nftables mode (its tables live in the node's
 * network namespace and go with it) turns ClusterIPs into endpoints, and a trimmed CoreDNS
 * (scripts/tools/go/coredns, plugins in ./binaries.ts) answers `*.svc.cluster.local` on the
 * node's address, the `clusterDNS` the kubelet gives every pod. CoreDNS forwards nothing:
 * there is nothing upstream to ask.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { dumpYaml } from '@kubernetes/client-node';
import { CLUSTER_DNS } from './config.ts';
import { NODE_NAME, POD_CIDR } from './kubelet.ts';
import type { NodeNamespace } from './namespace.ts';

/** Where kube-proxy and CoreDNS answer their health checks, inside the node (127.0.0.1 there). */
export const HEALTH_PORTS = { kubeProxy: 10256, dnsReady: 8182, dnsHealth: 8081 } as const;

/**
 * kube-proxy's configuration (KubeProxyConfiguration v1alpha1). The conntrack settings are
 * left as the kernel has them (`maxPerCore: 0`, timeouts 0): they are the host's sysctls. Pure.
 */
export function kubeProxyConfig(o: { kubeconfig: string; address: string }): string {
  return dumpYaml({
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    mode: 'nftables',
    clientConnection: { kubeconfig: o.kubeconfig },
    clusterCIDR: POD_CIDR,
    hostnameOverride: NODE_NAME,
    bindAddress: o.address,
    healthzBindAddress: `127.0.0.1:${HEALTH_PORTS.kubeProxy}`,
    metricsBindAddress: '127.0.0.1:10249',
    nodePortAddresses: ['primary'],
    conntrack: { maxPerCore: 0, tcpEstablishedTimeout: '0s', tcpCloseWaitTimeout: '0s' },
  });
}

/**
 * CoreDNS's Corefile: cluster DNS on the node's address for `cluster.local` and reverse
 * lookups; `loop` stops it if it ever answers itself; no `forward`. Pure.
 */
export function corefile(o: { kubeconfig: string; context: string }): string {
  return `.:53 {
    bind ${CLUSTER_DNS.address}
    errors
    health 127.0.0.1:${HEALTH_PORTS.dnsHealth}
    ready 127.0.0.1:${HEALTH_PORTS.dnsReady}
    kubernetes ${CLUSTER_DNS.domain} in-addr.arpa ip6.arpa {
        kubeconfig ${o.kubeconfig} ${o.context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    loop
}
`;
}

/** Starts kube-proxy inside `ns`; its configuration and log go under `<dir>/kube-proxy/`. */
export function startKubeProxy(ns: NodeNamespace, o: { dir: string; bin: string; kubeconfig: string }): ChildProcess {
  const base = join(o.dir, 'kube-proxy');
  mkdirSync(base, { recursive: true });
  const config = join(base, 'config.yaml');
  writeFileSync(config, kubeProxyConfig({ kubeconfig: o.kubeconfig, address: ns.address }));
  const log = openSync(join(base, 'kube-proxy.log'), 'a');
  return ns.spawn(o.bin, [`--config=${config}`, '--v=1'], { stdio: ['ignore', log, log] });
}

/**
 * Starts CoreDNS inside `ns`; its Corefile and log go under `<dir>/coredns/`.
 * @param o.kubeconfig a kubeconfig that may list and watch Services, EndpointSlices and
 *   Namespaces, and the name of its context.
 */
export function startCoreDNS(
  ns: NodeNamespace,
  o: { dir: string; bin: string; kubeconfig: string; context: string },
): ChildProcess {
  const base = join(o.dir, 'coredns');
  mkdirSync(base, { recursive: true });
  const conf = join(base, 'Corefile');
  writeFileSync(conf, corefile(o));
  const log = openSync(join(base, 'coredns.log'), 'a');
  return ns.spawn(o.bin, ['-conf', conf], { stdio: ['ignore', log, log] });
}
