/**
 * The test node's pure parts: the forward's first line, the holder's configuration, the
 * kubelet's, kube-proxy's, CoreDNS's and the pod network's configuration, and a function's pod
 * as Knative would run it from the rendered manifests, and its environment in local mode.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { loadAllYaml, type KubernetesObject } from '@kubernetes/client-node';
import { parseHolderConfig } from '../../scripts/node/config.ts';
import { containerdConfig } from '../../scripts/node/containerd.ts';
import { parseTarget } from '../../scripts/node/forward.ts';
import { cniConflist, kubeletConfig, POD_CIDR } from '../../scripts/node/kubelet.ts';
import { functionPod } from '../../scripts/node/pods.ts';
import { hostsToml } from '../../scripts/node/registry.ts';
import { corefile, kubeProxyConfig } from '../../scripts/node/services.ts';
import {
  functionEnv,
  knativeContainer,
  SOURCE_HEAP_OVERHEAD_MB,
  withSourceHeap,
} from '../../scripts/system/functions.ts';
import { KNATIVE_LAYOUT, render } from '../../scripts/tools/kustomize.ts';
import * as fx from '../helpers/fixtures.ts';

describe("the forward's first line", () => {
  fx.rows(
    [
      { name: 'a pod address', line: '10.244.0.5:8080', want: { host: '10.244.0.5', port: 8080 } },
      { name: 'loopback inside the node', line: '127.0.0.1:10256', want: { host: '127.0.0.1', port: 10256 } },
      { name: 'port 0', line: '10.0.0.1:0', want: undefined },
      { name: 'port too large', line: '10.0.0.1:65536', want: undefined },
      { name: 'no port', line: '10.0.0.1', want: undefined },
      { name: 'a host name', line: 'kubernetes:443', want: undefined },
      { name: 'an octet over 255', line: '10.0.0.256:80', want: undefined },
      { name: 'IPv6', line: '[::1]:80', want: undefined },
      { name: 'trailing text', line: '10.0.0.1:80 x', want: undefined },
    ],
    (r) => assert.deepEqual(parseTarget(r.line), r.want),
  );
});

describe("the holder's configuration", () => {
  const ok = {
    bridge: 'node0',
    address: '10.240.0.1/24',
    serviceCidr: '10.0.0.0/24',
    cgroupRoot: 'captf-node-0123456789',
    cgroupHierarchies: ['memory'],
    socket: '/tmp/n/forward.sock',
    resolvConf: 'nameserver 10.240.0.1\n',
  };
  it('takes a complete one, with the default grace', () =>
    assert.deepEqual(parseHolderConfig(JSON.stringify(ok)), { ...ok, graceMs: 10_000 }));
  fx.rows(
    [
      { name: 'not JSON', raw: '{', want: /as JSON/ },
      { name: 'no socket', raw: JSON.stringify({ ...ok, socket: '' }), want: /socket is missing/ },
      { name: 'no resolver', raw: JSON.stringify({ ...ok, resolvConf: undefined }), want: /resolvConf is missing/ },
      { name: 'a cgroup path', raw: JSON.stringify({ ...ok, cgroupRoot: '../x' }), want: /one path element/ },
      {
        name: 'no hierarchies',
        raw: JSON.stringify({ ...ok, cgroupHierarchies: 'memory' }),
        want: /cgroupHierarchies/,
      },
    ],
    (r) => assert.throws(() => parseHolderConfig(r.raw), r.want),
  );
});

describe("the node's components' configuration", () => {
  const paths = {
    root: '/n/kubelet/root',
    podLogs: '/n/kubelet/pod-logs',
    resolvConf: '/n/kubelet/resolv.conf',
    runtime: '/n/containerd/containerd.sock',
    clientCA: '/cp/pki/client-ca.crt',
  };
  it('the kubelet: cgroup v1 allowed, the node cgroup root, webhook authn/authz, cluster DNS on the node', () => {
    const [c] = loadAllYaml(kubeletConfig({ paths, address: '10.240.0.1', cgroupRoot: 'captf-node-x' })) as Record<
      string,
      unknown
    >[];
    assert.equal(c!.failCgroupV1, false);
    assert.equal(c!.cgroupDriver, 'cgroupfs');
    assert.equal(c!.cgroupRoot, '/captf-node-x');
    assert.equal(c!.containerRuntimeEndpoint, 'unix:///n/containerd/containerd.sock');
    assert.deepEqual(c!.authentication, {
      anonymous: { enabled: false },
      webhook: { enabled: true },
      x509: { clientCAFile: '/cp/pki/client-ca.crt' },
    });
    assert.deepEqual(c!.authorization, { mode: 'Webhook' });
    assert.deepEqual(c!.clusterDNS, ['10.240.0.1']);
    assert.equal(c!.readOnlyPort, 0);
  });

  it('the pod network: one bridge as gateway, host-local in the pod range with its own data folder, no loopback', () => {
    const c = JSON.parse(cniConflist('/n/ipam')) as { plugins: { type: string; ipam?: Record<string, unknown> }[] };
    assert.deepEqual(
      c.plugins.map((p) => p.type),
      ['bridge'],
    );
    assert.equal(c.plugins[0]!.ipam!.dataDir, '/n/ipam');
    assert.deepEqual(c.plugins[0]!.ipam!.ranges, [[{ subnet: POD_CIDR, gateway: '10.244.0.1' }]]);
  });

  it('kube-proxy: nftables, the host conntrack sysctls left alone', () => {
    const [c] = loadAllYaml(kubeProxyConfig({ kubeconfig: '/k', address: '10.240.0.1' })) as Record<string, unknown>[];
    assert.equal(c!.mode, 'nftables');
    assert.deepEqual(c!.conntrack, { maxPerCore: 0, tcpEstablishedTimeout: '0s', tcpCloseWaitTimeout: '0s' });
  });

  it('CoreDNS: bound to the node, cluster.local, nothing forwarded upstream', () => {
    const f = corefile({ kubeconfig: '/k', context: 'admin@captf-local' });
    assert.match(f, /bind 10\.240\.0\.1/);
    assert.match(f, /kubernetes cluster\.local in-addr\.arpa ip6\.arpa \{\n\s+kubeconfig \/k admin@captf-local/);
    assert.doesNotMatch(f, /forward/);
  });
});

describe("the node's registry", () => {
  it("containerd reads registry hosts from its own certs.d, so a node's hosts.toml changes nothing of the machine's", () => {
    const text = containerdConfig({
      root: '/n/containerd',
      bin: { runc: '/b/runc', bridge: '/b/cni/bridge' },
      sandboxImage: 'p:1',
    });
    assert.match(
      text,
      /\[plugins\.'io\.containerd\.cri\.v1\.images'\.registry\]\n\s+config_path = "\/n\/containerd\/certs\.d"\n/,
    );
  });

  it('the registry over plain HTTP', () => {
    assert.equal(hostsToml('localhost:4321'), 'server = "http://localhost:4321"\n');
  });
});

describe('a function as Knative would run its pod', () => {
  it('keeps the rendered pod spec and adds PORT, K_*, probe ports, the grace period from timeoutSeconds', async () => {
    const rendered = (await render(KNATIVE_LAYOUT)) as KubernetesObject[];
    const pod = functionPod(rendered, 'mirror-sync', { image: 'captf-credentials:test' });
    const c = pod.spec!.containers[0]!;
    assert.equal(pod.metadata!.namespace, 'captf-system');
    assert.equal(pod.spec!.serviceAccountName, 'captf-mirror-sync');
    assert.equal(pod.spec!.terminationGracePeriodSeconds, 600);
    assert.equal(pod.spec!.enableServiceLinks, false);
    assert.equal((pod.spec as unknown as Record<string, unknown>).containerConcurrency, undefined);
    assert.deepEqual(c.args, ['mirror-sync']);
    assert.equal(c.image, 'captf-credentials:test');
    assert.equal(c.imagePullPolicy, 'Never');
    assert.equal(c.securityContext?.readOnlyRootFilesystem, true);
    assert.deepEqual(c.resources?.limits, { memory: '192Mi' });
    const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e.value]));
    assert.deepEqual(
      [env.PORT, env.K_SERVICE, env.K_CONFIGURATION, env.K_REVISION, env.CAPTF_DRAIN_SECONDS],
      ['8080', 'captf-mirror-sync', 'captf-mirror-sync', 'captf-mirror-sync-00001', '600'],
    );
    assert.equal(c.readinessProbe?.httpGet?.port, 8080);
    assert.equal(c.livenessProbe?.httpGet?.port, 8080);
  });

  it('refuses a function the manifests do not hold', () =>
    assert.throws(() => functionPod([], 'admission', { image: 'x' }), /no Knative Service for admission/));
});

describe('a function as the local mode and the tests run it', () => {
  it("from source or from the bundles, with its Knative Service's variables: the heap caps of NODE_OPTIONS included (from source, raised by what the sources cost)", async () => {
    const rendered = (await render(KNATIVE_LAYOUT)) as KubernetesObject[];
    const leaf = { cert: '/c', key: '/k' };
    for (const build of [
      { main: 'functions/main.ts', from: 'source' },
      { main: 'dist/main.mjs', from: 'bundles' },
    ] as const)
      for (const fn of ['admission', 'mirror-sync', 'identity-status'] as const) {
        const env = functionEnv(fn, { build, kubeconfig: '/kc', leaf, rendered });
        const shipped = knativeContainer(rendered, fn)!.env!.find((e) => e.name === 'NODE_OPTIONS')!.value;
        assert.match(shipped!, /--max-old-space-size=\d+/);
        // From source, the old space is raised by what loading the sources costs beyond the bundle.
        const want = build.from === 'bundles' ? shipped : withSourceHeap(shipped!);
        assert.equal(env.NODE_OPTIONS, want, `${fn} from ${build.main}`);
        const cap = (o: string) => Number(/--max-old-space-size=(\d+)/.exec(o)![1]);
        assert.equal(cap(env.NODE_OPTIONS!) - cap(shipped!), build.from === 'bundles' ? 0 : SOURCE_HEAP_OVERHEAD_MB);
        assert.deepEqual([env.PORT, env.HOST, env.KUBECONFIG], ['0', '127.0.0.1', '/kc']);
        // As the image runs them: it ships no compile cache.
        assert.equal(env.NODE_COMPILE_CACHE, undefined);
        assert.equal(env.NODE_ENV, build.from === 'bundles' ? 'production' : undefined);
      }
  });
});
