/**
 * Every Go-built tool, by tool set. A set is built together from its wrapper modules
 * (scripts/tools/go/<module>, which pin the versions) through the Go module proxy into
 * `.cache/<set>/<module>-<version>…-<digest>/bin` by scripts/tools/build.ts (ensureTool),
 * and rebuilt only when a wrapper's go.mod/go.sum or a set's source patches change.
 */

/** One Go wrapper module and the main packages it builds. */
export interface GoTool {
  /** Folder under scripts/tools/go/. */
  module: string;
  /** Module whose `require` line pins the version shown in the cache key. */
  versionOf: string;
  /** What to build: binary name (in the set's `bin/`) → main package. */
  binaries: Readonly<Record<string, string>>;
  /** Extra `-ldflags` computed from the pinned version. */
  ldflags?: (version: string) => string[];
  /** Build with cgo (`CGO_ENABLED=1`; gcc and the C headers are Debian packages `.ci/run` installs). */
  cgo?: boolean;
  /** Go build tags, e.g. `seccomp`. */
  tags?: readonly string[];
  /**
   * Source patches of dependencies, applied to module copies used through `go build -modfile`
   * (the module cache and the wrapper module are never modified); part of the cache key, so
   * changing one rebuilds.
   */
  patches?: readonly GoSourcePatch[];
}

/**
 * A patch of one dependency module, applied at build time to a copy of the pinned module (under
 * the tool's cache folder) that the build uses through a generated `-modfile` with a `replace`
 * (Go refuses `-overlay` for files in the module cache). Serialized into the cache key as
 * written, so leave unused fields out.
 */
export interface GoSourcePatch {
  /** Module path, e.g. `knative.dev/eventing` (its folder comes from `go list -m`). */
  module: string;
  /** The file `replace` edits and `add` writes beside, relative to the module root. */
  file?: string;
  /** Each `from` must occur exactly once in `file`; it becomes `to`. */
  replace?: readonly { from: string; to: string }[];
  /** New files in the folder of `file` (the module root without one): file name → content. */
  add?: Readonly<Record<string, string>>;
  /** Files or folders of the module to delete, relative to its root. */
  delete?: readonly string[];
  /** Flags for `go mod edit` on the copy's go.mod, e.g. `-droprequire=knative.dev/caching`. */
  goModEdit?: readonly string[];
}

/**
 * Knative Eventing's programs as upstream's `config/` runs them (each Deployment's `ko://`
 * image), by the name of their binary and image: the core controller and webhook, the PingSource
 * adapter, the MT channel broker's controller, ingress and filter, the InMemoryChannel's
 * controller and dispatcher.
 */
export const EVENTING_PROGRAMS = {
  'eventing-controller': 'controller',
  'eventing-webhook': 'webhook',
  'eventing-mtping': 'mtping',
  'eventing-mtchannel-broker': 'mtchannel_broker',
  'eventing-broker-ingress': 'broker/ingress',
  'eventing-broker-filter': 'broker/filter',
  'eventing-imc-controller': 'in_memory/channel_controller',
  'eventing-imc-dispatcher': 'in_memory/channel_dispatcher',
} as const;

/** The environment variables the patched dispatcher reads its HTTP and HTTPS ports from. */
export const IMC_PORT_ENV = { http: 'CAPTF_IMC_HTTP_PORT', https: 'CAPTF_IMC_HTTPS_PORT' } as const;

/**
 * The InMemoryChannel dispatcher's listening ports are constants upstream (8080 and 8443 in
 * knative.dev/eventing pkg/reconciler/inmemorychannel/dispatcher/controller.go), which collide
 * with the ApiServerSource adapter's probe port and allow one data plane per machine: this
 * takes the two constant lines out and adds a file to the same package declaring them as
 * variables read from {@link IMC_PORT_ENV} (default: the upstream values).
 * docs/eventing-dataplane.md explains it.
 */
export const IMC_DISPATCHER_PORTS_PATCH: GoSourcePatch = {
  module: 'knative.dev/eventing',
  file: 'pkg/reconciler/inmemorychannel/dispatcher/controller.go',
  replace: [{ from: '\thttpPort      = 8080\n\thttpsPort     = 8443\n', to: '' }],
  add: {
    'zz_captf_ports.go': `// Added by captf-credentials (scripts/tools/registry.ts) to a copy of this module: the
// dispatcher's two listening ports, constants upstream, come from the environment so that
// several dispatchers (and other servers on :8080) can run on one machine.
package dispatcher

import (
	"log"
	"os"
	"strconv"
)

var (
	httpPort  = captfPortFromEnv("${IMC_PORT_ENV.http}", 8080)
	httpsPort = captfPortFromEnv("${IMC_PORT_ENV.https}", 8443)
)

// captfPortFromEnv returns the port in the environment variable name, or def when it is unset.
func captfPortFromEnv(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 {
		log.Fatalf("%s=%q is not a port number", name, v)
	}
	return p
}
`,
  },
};

/** Binary names of the four Eventing data-plane processes. */
export const EVENTING_BINARIES = {
  ingress: 'broker-ingress',
  filter: 'broker-filter',
  dispatcher: 'imc-dispatcher',
  mtping: 'mtping',
} as const;

/** Version stamps of Kubernetes binaries; without them `/version` reports v0.0.0-master. */
function kubernetesLdflags(v: string): string[] {
  const [major, minor] = v.replace(/^v/, '').split('.');
  return [
    `-X k8s.io/component-base/version.gitVersion=${v}`,
    `-X k8s.io/component-base/version.gitMajor=${major}`,
    `-X k8s.io/component-base/version.gitMinor=${minor}`,
    '-X k8s.io/component-base/version.gitTreeState=clean',
  ];
}

const EVENTING = 'knative.dev/eventing';
const CONTAINERD = 'github.com/containerd/containerd/v2';
const CNI_PLUGINS = 'github.com/containernetworking/plugins/plugins';

const SERVING = 'knative.dev/serving';
const REVISION = 'pkg/reconciler/revision';
/** Removes one exact text (see {@link applySourcePatch}) from a file of the Serving module. */
const servingCut = (file: string, ...cuts: string[]): GoSourcePatch => ({
  module: SERVING,
  file: `${REVISION}/${file}`,
  replace: cuts.map((from) => ({ from, to: '' })),
});

/**
 * Knative Serving without its image-cache reconciler: the Go module proxy refuses the
 * \`knative.dev/caching\` version Serving requires (403), and the cache's \`Image\` objects only
 * warm a registry cache no test node has. The revision reconciler's \`reconcileImageCache\`
 * phase, its client, lister and informer, \`createImageCache\` and \`resources/imagecache.go\`
 * go; nothing else of Serving changes. docs/deploy-knative.md says what this costs (nothing a
 * cluster without Knative's image cache notices).
 */
export const SERVING_IMAGE_CACHE_PATCHES: readonly GoSourcePatch[] = [
  { module: SERVING, delete: [`${REVISION}/resources/imagecache.go`], goModEdit: ['-droprequire=knative.dev/caching'] },
  servingCut(
    'controller.go',
    '\tcachingclient "knative.dev/caching/pkg/client/injection/client"\n',
    '\timageinformer "knative.dev/caching/pkg/client/injection/informers/caching/v1alpha1/image"\n',
    '\timageInformer := imageinformer.Get(ctx)\n',
    '\t\tcachingclient:    cachingclient.Get(ctx),\n',
    '\t\timageLister:         imageInformer.Lister(),\n',
  ),
  servingCut(
    'revision.go',
    '\tcachingclientset "knative.dev/caching/pkg/client/clientset/versioned"\n',
    '\tcachinglisters "knative.dev/caching/pkg/client/listers/caching/v1alpha1"\n',
    '\tcachingclient    cachingclientset.Interface\n',
    '\timageLister         cachinglisters.ImageLister\n',
    '\t\tc.reconcileImageCache,\n',
  ),
  servingCut(
    'cruds.go',
    '\tcaching "knative.dev/caching/pkg/apis/caching/v1alpha1"\n',
    `func (c *Reconciler) createImageCache(ctx context.Context, rev *v1.Revision, containerName, imageDigest string) (*caching.Image, error) {
	image := resources.MakeImageCache(rev, containerName, imageDigest)
	return c.cachingclient.CachingV1alpha1().Images(image.Namespace).Create(ctx, image, metav1.CreateOptions{})
}

`,
  ),
  servingCut(
    'reconcile_resources.go',
    '\t"knative.dev/pkg/kmeta"\n',
    `func (c *Reconciler) reconcileImageCache(ctx context.Context, rev *v1.Revision) error {
	logger := logging.FromContext(ctx)

	ns := rev.Namespace
	// Revisions are immutable.
	// Updating image results to new revision so there won't be any chance of resource leak.
	for _, container := range append(rev.Status.ContainerStatuses, rev.Status.InitContainerStatuses...) {
		imageName := kmeta.ChildName(resourcenames.ImageCache(rev), "-"+container.Name)
		if _, err := c.imageLister.Images(ns).Get(imageName); apierrs.IsNotFound(err) {
			if _, err := c.createImageCache(ctx, rev, container.Name, container.ImageDigest); err != nil {
				return fmt.Errorf("failed to create image cache %q: %w", imageName, err)
			}
			logger.Infof("Created image cache %q", imageName)
		} else if err != nil {
			return fmt.Errorf("failed to get image cache %q: %w", imageName, err)
		}
	}
	return nil
}

`,
  ),
];

/** A tool set's name: its key in {@link TOOLS} and its folder under `.cache/`. */
export type ToolSet =
  | 'controlplane'
  | 'eventing'
  | 'knative'
  | 'kustomize'
  | 'kubectl'
  | 'imagebuild'
  | 'netpol'
  | 'node'
  | 'observability'
  | 'serving'
  | 'traefik';

/**
 * The tool sets; a set's name is its cache folder under `.cache/`. Knative Eventing 1.22 is
 * knative.dev/eventing v0.49.x (the eventing and knative wrappers pin the same one); kustomize
 * v5.8.2 is the newest whose go.mod accepts Go 1.26.
 */
export const TOOLS: Readonly<Record<ToolSet, readonly GoTool[]>> = {
  /** etcd, kube-apiserver and kube-controller-manager for the test control plane (SPEC §15). */
  controlplane: [
    { module: 'etcd', versionOf: 'go.etcd.io/etcd/server/v3', binaries: { etcd: 'go.etcd.io/etcd/server/v3' } },
    {
      module: 'kubernetes',
      versionOf: 'k8s.io/kubernetes',
      binaries: {
        'kube-apiserver': 'k8s.io/kubernetes/cmd/kube-apiserver',
        'kube-controller-manager': 'k8s.io/kubernetes/cmd/kube-controller-manager',
      },
      ldflags: kubernetesLdflags,
    },
  ],
  /** Knative Eventing's broker data plane, run by scripts/eventing/dataplane.ts. */
  eventing: [
    {
      module: 'eventing',
      versionOf: EVENTING,
      binaries: {
        [EVENTING_BINARIES.ingress]: `${EVENTING}/cmd/broker/ingress`,
        [EVENTING_BINARIES.filter]: `${EVENTING}/cmd/broker/filter`,
        [EVENTING_BINARIES.dispatcher]: `${EVENTING}/cmd/in_memory/channel_dispatcher`,
        [EVENTING_BINARIES.mtping]: `${EVENTING}/cmd/mtping`,
      },
      patches: [IMC_DISPATCHER_PORTS_PATCH],
    },
  ],
  /** Knative's ApiServerSource receive adapter (scripts/eventing/adapter.ts) and Eventing's programs. */
  knative: [
    {
      module: 'knative',
      versionOf: EVENTING,
      binaries: {
        apiserver_receive_adapter: `${EVENTING}/cmd/apiserver_receive_adapter`,
        // Eventing's own installation on the test node, each program an image as ko builds it
        // (scripts/eventing/install.ts); unpatched, since each runs in a pod of its own.
        ...Object.fromEntries(Object.entries(EVENTING_PROGRAMS).map(([name, cmd]) => [name, `${EVENTING}/cmd/${cmd}`])),
      },
    },
  ],
  /** kustomize, to render manifests/ as `kubectl apply -k` would (scripts/tools/kustomize.ts). */
  kustomize: [
    {
      module: 'kustomize',
      versionOf: 'sigs.k8s.io/kustomize/kustomize/v5',
      binaries: { kustomize: 'sigs.k8s.io/kustomize/kustomize/v5' },
    },
  ],
  /** kubectl at the control plane's version, for tests that apply examples/ as a user would. */
  kubectl: [
    {
      module: 'kubectl',
      versionOf: 'k8s.io/kubernetes',
      binaries: { kubectl: 'k8s.io/kubernetes/cmd/kubectl' },
      ldflags: kubernetesLdflags,
    },
  ],
  /**
   * The daemonless image builder `captf-image` (go-containerregistry) and `pause`, the process of
   * a pod's sandbox container, both from the wrapper's own sources (scripts/image/); and
   * go-containerregistry's own `registry` (an in-memory OCI distribution registry on
   * `localhost:<-port>`), which the image test pushes the documented way into.
   */
  imagebuild: [
    {
      module: 'image',
      versionOf: 'github.com/google/go-containerregistry',
      binaries: {
        'captf-image': 'captf.local/tools/image',
        pause: 'captf.local/tools/image/pause',
        registry: 'github.com/google/go-containerregistry/cmd/registry',
      },
    },
  ],
  /**
   * A real node for the tests that run the image as pods: the kubelet, kube-proxy and the
   * scheduler from the control plane's Kubernetes module; containerd with its runc shim and
   * ctr; runc with seccomp (RuntimeDefault profiles); the CNI plugins of the pod network; and
   * CoreDNS trimmed to the plugins cluster DNS needs (scripts/tools/go/coredns/main.go).
   */
  node: [
    {
      module: 'kubernetes',
      versionOf: 'k8s.io/kubernetes',
      binaries: {
        kubelet: 'k8s.io/kubernetes/cmd/kubelet',
        'kube-proxy': 'k8s.io/kubernetes/cmd/kube-proxy',
        'kube-scheduler': 'k8s.io/kubernetes/cmd/kube-scheduler',
      },
      ldflags: kubernetesLdflags,
    },
    {
      module: 'containerd',
      versionOf: CONTAINERD,
      binaries: {
        containerd: `${CONTAINERD}/cmd/containerd`,
        'containerd-shim-runc-v2': `${CONTAINERD}/cmd/containerd-shim-runc-v2`,
        ctr: `${CONTAINERD}/cmd/ctr`,
      },
      ldflags: (v) => [`-X ${CONTAINERD}/version.Version=${v}`],
    },
    {
      module: 'runc',
      versionOf: 'github.com/opencontainers/runc',
      binaries: { runc: 'github.com/opencontainers/runc' },
      ldflags: (v) => [`-X main.version=${v.replace(/^v/, '')}`],
      cgo: true,
      tags: ['seccomp'],
    },
    {
      module: 'cni',
      versionOf: 'github.com/containernetworking/plugins',
      binaries: {
        bridge: `${CNI_PLUGINS}/main/bridge`,
        'host-local': `${CNI_PLUGINS}/ipam/host-local`,
        loopback: `${CNI_PLUGINS}/main/loopback`,
        portmap: `${CNI_PLUGINS}/meta/portmap`,
      },
    },
    { module: 'coredns', versionOf: 'github.com/coredns/coredns', binaries: { coredns: 'captf.local/tools/coredns' } },
  ],
  /**
   * kube-router's NetworkPolicy firewall, for a test node that enforces policies
   * (scripts/node/netpol.ts); a set of its own, so only the node files that ask for it wait on it.
   */
  netpol: [
    {
      module: 'kube-router',
      versionOf: 'github.com/cloudnativelabs/kube-router/v2',
      binaries: { 'kube-router': 'github.com/cloudnativelabs/kube-router/v2/cmd/kube-router' },
    },
  ],
  /**
   * The receivers of the functions' telemetry in the test world (scripts/observability/):
   * Prometheus 3.16 (`cmd/prometheus`, whose OTLP receiver takes pushed metrics) and Jaeger v2
   * (`cmd/jaeger` of module tag v1.75.0: OTLP traces in, its query API out).
   */
  observability: [
    {
      module: 'prometheus',
      versionOf: 'github.com/prometheus/prometheus',
      binaries: { prometheus: 'github.com/prometheus/prometheus/cmd/prometheus' },
    },
    {
      module: 'jaeger',
      versionOf: 'github.com/jaegertracing/jaeger',
      binaries: { jaeger: 'github.com/jaegertracing/jaeger/cmd/jaeger' },
    },
  ],
  /**
   * Knative Serving on the test node (scripts/serving/): its five programs, without the image
   * cache ({@link SERVING_IMAGE_CACHE_PATCHES}).
   */
  serving: [
    {
      module: 'serving',
      versionOf: SERVING,
      binaries: Object.fromEntries(
        ['activator', 'autoscaler', 'controller', 'queue', 'webhook'].map((c) => [
          `serving-${c}`,
          `${SERVING}/cmd/${c}`,
        ]),
      ),
      patches: SERVING_IMAGE_CACHE_PATCHES,
    },
  ],
  /**
   * Traefik v3.6 with its Knative provider, the Serving node's KIngress (v3.7 cannot be built
   * here: a module it replaces with is refused by the proxy). The largest build of all (about
   * 2 500 packages), so a set of its own: a change to Serving's patches does not rebuild it.
   */
  traefik: [
    {
      module: 'traefik',
      versionOf: 'github.com/traefik/traefik/v3',
      binaries: { traefik: 'github.com/traefik/traefik/v3/cmd/traefik' },
    },
  ],
};
