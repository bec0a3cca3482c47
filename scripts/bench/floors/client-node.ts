/**
 * The cold-start row's library floor: a bare Node HTTP server that first does what every
 * function does before it can answer, and nothing else: load `@kubernetes/client-node`, read
 * the kubeconfig from the environment and make the API clients the functions make
 * (functions/lib/kube.ts). Bundled as the functions are (scripts/lib/bundles.ts); prints
 * `{"port":N}` once listening, as the bare server does (scripts/bench/baselines.ts).
 */
import { createServer } from 'node:http';
import {
  AuthenticationV1Api,
  AuthorizationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  EventsV1Api,
  KubeConfig,
  KubernetesObjectApi,
} from '@kubernetes/client-node';

const kc = new KubeConfig();
kc.loadFromDefault();
const clients = [
  kc.makeApiClient(CoreV1Api),
  kc.makeApiClient(CustomObjectsApi),
  kc.makeApiClient(AuthorizationV1Api),
  kc.makeApiClient(AuthenticationV1Api),
  kc.makeApiClient(EventsV1Api),
  KubernetesObjectApi.makeApiClient(kc),
];
const s = createServer((_req, res) => res.end(String(clients.length)));
s.listen(0, '127.0.0.1', () => console.log(JSON.stringify({ port: (s.address() as { port: number }).port })));
process.on('SIGTERM', () => s.close(() => process.exit(0)));
