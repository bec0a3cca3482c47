/**
 * Knative Eventing's broker data plane binaries: the MTChannelBasedBroker ingress and filter,
 * the InMemoryChannel dispatcher (with its ports patched to come from {@link IMC_PORT_ENV})
 * and the PingSource adapter `mtping`, tool set `eventing` of scripts/tools/registry.ts.
 * scripts/eventing/dataplane.ts runs them; docs/eventing-dataplane.md explains the patch.
 */
import { dirname, join } from 'node:path';
import { ensureTool } from '../tools/build.ts';
import { EVENTING_BINARIES } from '../tools/registry.ts';

export { EVENTING_BINARIES, IMC_PORT_ENV } from '../tools/registry.ts';

/** One of the four data-plane processes. */
export type EventingComponent = keyof typeof EVENTING_BINARIES;

/** Paths of the four binaries, by component. */
export type EventingBinaries = Record<EventingComponent, string>;

/**
 * Finds or builds the four data-plane binaries (about 2 minutes on two cores once the modules
 * are downloaded). Parallel callers (test files) wait for one build under the build lock.
 * @param log progress lines (default stderr).
 * @returns the absolute path of each binary.
 * @throws Error with the tail of the `go` output when the download or build fails, or when the
 *   patch no longer matches the pinned upstream file.
 */
export async function ensureEventingDataPlane(log?: (line: string) => void): Promise<EventingBinaries> {
  const dir = dirname(await ensureTool('eventing', EVENTING_BINARIES.ingress, log));
  const entries = Object.entries(EVENTING_BINARIES).map(([c, b]) => [c, join(dir, b)]);
  return Object.fromEntries(entries) as EventingBinaries;
}
