/**
 * Test access to the one control plane `npm test` started (scripts/test.ts): admin and
 * minted-user clients. A test file's namespaces and objects come from its world
 * (fixtures.ts).
 */
import { randomBytes } from 'node:crypto';
import { loadKubeConfig, makeClients, type Clients } from '../../functions/lib/kube.ts';
import { plantSentinels } from './leaks.ts';
import { userKubeConfig, webhookClientCaPath as controlPlaneCaPath } from '../../scripts/controlplane/controlplane.ts';

/** Folder of the running test control plane; throws when tests run outside `npm test`. */
export function controlPlaneDir(): string {
  const dir = process.env.CAPTF_TEST_CONTROLPLANE;
  if (!dir) throw new Error('CAPTF_TEST_CONTROLPLANE is not set: run integration tests through `npm test`');
  return dir;
}

/**
 * The CA of the client certificate the test control plane's API server presents to webhooks
 * (scripts/controlplane/controlplane.ts `webhookClientCaPath`).
 */
export const webhookClientCaPath = (): string => controlPlaneCaPath(controlPlaneDir());

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

/** The shared wait-until of scripts and tests (scripts/lib/wait.ts). */
export { eventually } from '../../scripts/lib/wait.ts';
