/**
 * Knative Eventing's broker data plane, built from the Go module proxy like the
 * ApiServerSource adapter (scripts/eventing/adapter.ts): the MTChannelBasedBroker ingress and filter,
 * the InMemoryChannel dispatcher and the PingSource adapter `mtping`, from the wrapper module
 * scripts/tools/go/eventing (knative.dev/eventing v0.49.2), cached in
 * `.cache/eventing/…`. scripts/eventing/dataplane.ts runs them.
 *
 * One upstream file is patched, at build time and only for the build: the dispatcher's
 * listening ports are constants upstream (8080 and 8443 in knative.dev/eventing
 * pkg/reconciler/inmemorychannel/dispatcher/controller.go), which collide with the
 * ApiServerSource adapter's probe port and allow one data plane per machine. The patch deletes
 * the two constant lines and adds a file to the same package that declares them as variables
 * read from `CAPTF_IMC_HTTP_PORT` / `CAPTF_IMC_HTTPS_PORT` (default: the upstream values). It
 * is applied by exact string replacement to a copy of the pinned module made from the module
 * cache (Go refuses `-overlay` for module-cache files), which the build uses through a generated
 * `-modfile` with a `replace` (scripts/tools/build.ts GoSourcePatch). A different
 * upstream text fails the build loudly; the patch is part of the cache key.
 * docs/eventing-dataplane.md explains it.
 */
import { dirname, join } from 'node:path';
import type { GoSourcePatch, GoTool } from '../tools/build.ts';
import { pinnedVersion } from '../tools/build.ts';
import { ensureGoBinary } from '../tools/build-lock.ts';

/** The environment variables the patched dispatcher reads its HTTP and HTTPS ports from. */
export const IMC_PORT_ENV = { http: 'CAPTF_IMC_HTTP_PORT', https: 'CAPTF_IMC_HTTPS_PORT' } as const;

/**
 * The dispatcher's port patch (see the file comment): two constant lines out of the upstream
 * const block, and a new file of the same package declaring them as variables.
 */
export const IMC_DISPATCHER_PORTS_PATCH: GoSourcePatch = {
  module: 'knative.dev/eventing',
  file: 'pkg/reconciler/inmemorychannel/dispatcher/controller.go',
  replace: [{ from: '\thttpPort      = 8080\n\thttpsPort     = 8443\n', to: '' }],
  add: {
    'zz_captf_ports.go': `// Added by captf-credentials (scripts/eventing/build.ts) to a copy of this module: the
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

/** Binary names of the four data-plane processes. */
export const EVENTING_BINARIES = {
  ingress: 'broker-ingress',
  filter: 'broker-filter',
  dispatcher: 'imc-dispatcher',
  mtping: 'mtping',
} as const;

/** One of the four data-plane processes. */
export type EventingComponent = keyof typeof EVENTING_BINARIES;

/** The data plane's wrapper module (Knative Eventing 1.22 = knative.dev/eventing v0.49.x). */
export const EVENTING_TOOLS: readonly GoTool[] = [
  {
    module: 'eventing',
    versionOf: 'knative.dev/eventing',
    packages: [
      'knative.dev/eventing/cmd/broker/ingress',
      'knative.dev/eventing/cmd/broker/filter',
      'knative.dev/eventing/cmd/in_memory/channel_dispatcher',
      'knative.dev/eventing/cmd/mtping',
    ],
    outName: {
      'knative.dev/eventing/cmd/broker/ingress': EVENTING_BINARIES.ingress,
      'knative.dev/eventing/cmd/broker/filter': EVENTING_BINARIES.filter,
      'knative.dev/eventing/cmd/in_memory/channel_dispatcher': EVENTING_BINARIES.dispatcher,
      'knative.dev/eventing/cmd/mtping': EVENTING_BINARIES.mtping,
    },
    patches: [IMC_DISPATCHER_PORTS_PATCH],
  },
];

/** Paths of the four binaries, by component. */
export type EventingBinaries = Record<EventingComponent, string>;

/**
 * Finds or builds the four data-plane binaries (about 2 minutes on two cores once the modules
 * are downloaded; cached until the wrapper go.mod/go.sum or the patch change). Parallel
 * callers (test files) wait for one build under the build lock.
 * @param log progress lines (default stderr).
 * @returns the absolute path of each binary.
 * @throws Error with the tail of the `go` output when the download or build fails, or when the
 *   patch no longer matches the pinned upstream file.
 */
export async function ensureEventingDataPlane(log?: (line: string) => void): Promise<EventingBinaries> {
  const first = await ensureGoBinary(EVENTING_TOOLS, 'eventing', EVENTING_BINARIES.ingress, log);
  const dir = dirname(first);
  const entries = Object.entries(EVENTING_BINARIES).map(([c, b]) => [c, join(dir, b)]);
  return Object.fromEntries(entries) as EventingBinaries;
}

/** The knative.dev/eventing version the data plane pins (scripts/tools/go/eventing/go.mod). */
export const eventingVersion = (): string => pinnedVersion(EVENTING_TOOLS[0]!);
