/**
 * Test access to the one control plane `npm test` started (scripts/test.ts): admin and
 * minted-user clients, and per-file namespaces that are deleted after the file's tests,
 * pass or fail.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after } from 'node:test';
import { loadKubeConfig, makeClients, type Clients } from '../../functions/lib/kube.ts';
import { clusterLeaks, outputLeaks, plantSentinels } from './leaks.ts';
import { userKubeConfig } from '../../scripts/controlplane/controlplane.ts';

/** Folder of the running test control plane; throws when tests run outside `npm test`. */
export function controlPlaneDir(): string {
  const dir = process.env.CAPTF_TEST_CONTROLPLANE;
  if (!dir) throw new Error('CAPTF_TEST_CONTROLPLANE is not set: run integration tests through `npm test`');
  return dir;
}

/** Admin (system:masters) clients; every Secret they create carries a planted value (leaks.ts). */
export function admin(): Clients {
  return plantSentinels(makeClients(loadKubeConfig(`${controlPlaneDir()}/admin.kubeconfig`)));
}

/** Clients for a freshly minted client-certificate user. */
export async function asUser(
  name: string,
  groups: readonly string[] = [],
): Promise<Clients & { kubeconfigPath: string }> {
  const kubeconfigPath = await userKubeConfig(controlPlaneDir(), name, groups);
  return { ...plantSentinels(makeClients(loadKubeConfig(kubeconfigPath))), kubeconfigPath };
}

/** A short random suffix for names unique to this run. */
export const suffix = (): string => randomBytes(3).toString('hex');

/**
 * Returns a creator of namespaces named `<prefix>-<random>`; all of them (and any
 * cluster-scoped cleanup registered with `onCleanup`) are deleted after the file's tests.
 */
export function namespaces(prefix: string): {
  create(labels?: Record<string, string>): Promise<string>;
  onCleanup(fn: () => Promise<unknown>): void;
} {
  const created: string[] = [];
  const cleanups: (() => Promise<unknown>)[] = [];
  const { core } = admin();
  after(async () => {
    // Before anything is deleted: nothing the functions said or wrote may carry a planted value.
    const leaks = [...outputLeaks(), ...(await clusterLeaks(admin(), created))];
    for (const fn of cleanups.reverse()) await fn().catch(() => undefined);
    await Promise.all(created.map((name) => core.deleteNamespace({ name }).catch(() => undefined)));
    assert.deepEqual(leaks, [], 'no planted Secret value in any output, Event, condition or status');
  });
  return {
    async create(labels = {}) {
      const name = `${prefix}-${suffix()}`;
      await core.createNamespace({ body: { metadata: { name, labels } } });
      created.push(name);
      return name;
    },
    onCleanup(fn) {
      cleanups.push(fn);
    },
  };
}

/** The shared wait-until of scripts and tests (scripts/lib/wait.ts). */
export { eventually } from '../../scripts/lib/wait.ts';
