/**
 * Kubernetes API plumbing shared by every function: clients from a kubeconfig or the
 * in-cluster config, API-call counting, error classification and bounded conflict retry.
 * Nothing here caches API objects: handlers always re-read (SPEC §0).
 */
import {
  AuthenticationV1Api,
  AuthorizationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  EventsV1Api,
  KubeConfig,
  ServerConfiguration,
  createConfiguration,
  type Configuration,
} from '@kubernetes/client-node';
import { pooledAuthentication } from './api-pool.ts';

/**
 * Loads the kubeconfig the way a function does at start-up: an explicit path, else
 * `$KUBECONFIG`, else the in-cluster service account (Knative).
 * @throws Error when none of them is usable.
 */
export function loadKubeConfig(path?: string): KubeConfig {
  const kc = new KubeConfig();
  const file = path ?? process.env.KUBECONFIG;
  if (file) kc.loadFromFile(file);
  else if (process.env.KUBERNETES_SERVICE_HOST) kc.loadFromCluster();
  else throw new Error('no Kubernetes configuration: set KUBECONFIG or run in a cluster');
  if (!kc.getCurrentCluster()) throw new Error('kubeconfig has no current cluster');
  return kc;
}

/** Counts API requests made through a {@link Clients} set (for per-reconcile logs). */
export interface CallCounter {
  calls: number;
}

/** The typed API clients the functions use, all sharing one counter. */
export interface Clients {
  kc: KubeConfig;
  core: CoreV1Api;
  custom: CustomObjectsApi;
  authz: AuthorizationV1Api;
  events: EventsV1Api;
  counter: CallCounter;
}

/**
 * Builds the API clients on `kc`, counting every request in `counter`. Every client of the
 * process shares one kept-alive connection pool per TLS identity (api-pool.ts).
 * @param counter shared counter (a fresh one when omitted); reset it per reconcile.
 * @throws Error when the kubeconfig has no current cluster.
 */
export function makeClients(kc: KubeConfig, counter: CallCounter = { calls: 0 }): Clients {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('kubeconfig has no current cluster');
  const config: Configuration = createConfiguration({
    baseServer: new ServerConfiguration(cluster.server, {}),
    // Not `kc` itself: client-node would open a new TLS connection per request (api-pool.ts).
    authMethods: { default: pooledAuthentication(kc) },
    promiseMiddleware: [
      {
        pre: async (ctx) => {
          counter.calls++;
          return ctx;
        },
        post: async (ctx) => ctx,
      },
    ],
  });
  return {
    kc,
    core: new CoreV1Api(config),
    custom: new CustomObjectsApi(config),
    authz: new AuthorizationV1Api(config),
    events: new EventsV1Api(config),
    counter,
  };
}

/** HTTP status of an API error (`ApiException.code`, or a `statusCode`), else undefined. */
export function apiStatus(err: unknown): number | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const e = err as { code?: unknown; statusCode?: unknown };
  if (typeof e.code === 'number') return e.code;
  if (typeof e.statusCode === 'number') return e.statusCode;
  return undefined;
}

/** The API answered 404. */
export const isNotFound = (err: unknown): boolean => apiStatus(err) === 404;
/** The API answered 409 (resourceVersion precondition failed, or already exists). */
export const isConflict = (err: unknown): boolean => apiStatus(err) === 409;
/** The API answered 403. */
export const isForbidden = (err: unknown): boolean => apiStatus(err) === 403;

/**
 * A short, safe description of an API error: status code, reason and the Status message.
 * Never includes request bodies, so no Secret data can leak through it.
 */
export function describeError(err: unknown): string {
  if (err instanceof RedactedApiError) return err.message;
  const code = apiStatus(err);
  if (code === undefined) {
    const msg = err instanceof Error ? err.message : String(err);
    return msg.split('\n')[0]!.slice(0, 300);
  }
  const status = statusOf((err as { body?: unknown })?.body);
  const reason = status?.reason ? ` ${status.reason}` : '';
  const message = status?.message ? `: ${status.message.slice(0, 300)}` : '';
  return `HTTP ${code}${reason}${message}`;
}

/** The `metav1.Status` of an error body (text or parsed), or undefined. */
function statusOf(body: unknown): { reason?: string; message?: string } | undefined {
  if (typeof body === 'object' && body !== null) return body;
  if (typeof body !== 'string') return undefined;
  try {
    return JSON.parse(body) as { reason?: string; message?: string };
  } catch {
    return undefined;
  }
}

/**
 * Runs `fn` until it does not throw a 409, at most `attempts` times (re-reading state is
 * `fn`'s job, as in client-go's `retry.RetryOnConflict`).
 * @throws the last error when it is not a conflict or attempts run out.
 */
export async function retryOnConflict<T>(fn: (attempt: number) => Promise<T>, attempts = 8): Promise<T> {
  for (let i = 1; ; i++) {
    try {
      return await fn(i);
    } catch (err) {
      if (!isConflict(err) || i >= attempts) throw err;
      // Small jittered pause so concurrent writers of one mirror do not collide in lockstep.
      await new Promise((r) => setTimeout(r, Math.floor(Math.random() * 20 * i)));
    }
  }
}

/** An API error stripped of everything the server echoed back: code, reason, field names. */
export class RedactedApiError extends Error {
  readonly code: number | undefined;
  /** The Status's `details.causes[].reason` values (machine words such as `NamespaceTerminating`; never data). */
  readonly causes: readonly string[];
  /**
   * @param code HTTP status kept so `isConflict`/`isNotFound` still work.
   * @param causes cause reasons kept from the Status.
   */
  constructor(code: number | undefined, message: string, causes: readonly string[] = []) {
    super(message);
    this.code = code;
    this.causes = causes;
  }
}

/**
 * For errors of requests that carried or touched Secret data (mirror create, update and
 * delete: a webhook on DELETE sees the old object): the API server's message may quote the
 * values (an admission policy or webhook can echo them), so only the status code, a
 * Kubernetes-defined reason and Kubernetes-defined cause types survive. SPEC §15: no Secret
 * data in errors.
 * @returns a {@link RedactedApiError} (the input unchanged when it is not an API error).
 */
export function redactApiError(err: unknown): unknown {
  const code = apiStatus(err);
  if (code === undefined) return err;
  const status = statusOf((err as { body?: unknown }).body) as
    { reason?: unknown; details?: { causes?: { reason?: unknown }[] } } | undefined;
  const causes = Array.isArray(status?.details?.causes) ? status.details.causes : [];
  // Only words Kubernetes defines: a webhook chooses its reason and cause fields freely,
  // and may put the data it saw in them.
  const reasons = [
    ...new Set(causes.map((c) => c?.reason).filter((r): r is string => typeof r === 'string' && CAUSE_TYPES.has(r))),
  ];
  const reason = typeof status?.reason === 'string' && STATUS_REASONS.has(status.reason) ? ` ${status.reason}` : '';
  return new RedactedApiError(
    code,
    `HTTP ${code}${reason}; the API server's message is withheld because the request carried Secret data`,
    reasons,
  );
}

/** `metav1.StatusReason` values (k8s.io/apimachinery/pkg/apis/meta/v1/types.go). */
const STATUS_REASONS = new Set([
  'Unauthorized',
  'Forbidden',
  'NotFound',
  'AlreadyExists',
  'Conflict',
  'Gone',
  'Invalid',
  'ServerTimeout',
  'StoreReadError',
  'Timeout',
  'TooManyRequests',
  'BadRequest',
  'MethodNotAllowed',
  'NotAcceptable',
  'RequestEntityTooLarge',
  'UnsupportedMediaType',
  'InternalError',
  'Expired',
  'ServiceUnavailable',
]);

/** `metav1.CauseType` values (same file). */
const CAUSE_TYPES = new Set([
  'FieldValueNotFound',
  'FieldValueRequired',
  'FieldValueDuplicate',
  'FieldValueInvalid',
  'FieldValueNotSupported',
  'FieldValueForbidden',
  'FieldValueTooLong',
  'FieldValueTooMany',
  'InternalError',
  'FieldValueTypeInvalid',
  'UnexpectedServerResponse',
  'FieldManagerConflict',
  'ResourceVersionTooLarge',
  'NamespaceTerminating',
]);

const users = new WeakMap<KubeConfig, Promise<string>>();

/**
 * The user this process acts as, asked once per kubeconfig with a SelfSubjectReview
 * (`authentication.k8s.io/v1`, allowed to every authenticated user by the default
 * `system:basic-user` role); for messages that say who lacks a permission.
 * @returns the username, or `its ServiceAccount` when the review failed (never throws).
 */
export function whoAmI(kc: KubeConfig): Promise<string> {
  let user = users.get(kc);
  if (!user) {
    user = kc
      .makeApiClient(AuthenticationV1Api)
      .createSelfSubjectReview({ body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' } })
      .then((r) => r.status?.userInfo?.username ?? 'its ServiceAccount')
      .catch(() => {
        users.delete(kc); // ask again next time
        return 'its ServiceAccount';
      });
    users.set(kc, user);
  }
  return user;
}

/**
 * Resolves to undefined when `p` rejects with 404 (controller-runtime's `IgnoreNotFound`).
 * @throws every other error of `p`.
 */
export async function ignoreNotFound<T>(p: Promise<T>): Promise<T | undefined> {
  try {
    return await p;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/** One page of a Kubernetes list, as the generated clients return it. */
export interface ListPage<T> {
  items?: T[];
  metadata?: { continue?: string; _continue?: string; resourceVersion?: string };
}

/** Times a list is started over after its continue token expired, before giving up. */
export const LIST_RESTARTS = 2;

/**
 * Reads every page of a list (`limit` + `continue`). A continue token that expired midway
 * (410 Gone) restarts the list from the first page, at most {@link LIST_RESTARTS} times: a
 * partial list is never returned as if it were whole.
 * @param page fetches one page for a continue token (undefined = first page).
 * @returns every item and the resourceVersion of the list's last page.
 * @throws the 410 when restarts run out, and any other API error of a page.
 */
export async function listAllPages<T>(
  page: (cont: string | undefined) => Promise<ListPage<T>>,
): Promise<{ items: T[]; resourceVersion: string }> {
  for (let restart = 0; ; restart++) {
    const progress = { items: [] as T[], cont: undefined as string | undefined, resourceVersion: '' };
    try {
      return await readPages(page, progress);
    } catch (err) {
      if (apiStatus(err) !== 410 || progress.cont === undefined || restart >= LIST_RESTARTS) throw err;
    }
  }
}

/** Reads pages into `progress` until the last; `progress.cont` tells a caller how far it got. */
async function readPages<T>(
  page: (cont: string | undefined) => Promise<ListPage<T>>,
  progress: { items: T[]; cont: string | undefined; resourceVersion: string },
): Promise<{ items: T[]; resourceVersion: string }> {
  do {
    const p = await page(progress.cont);
    progress.items.push(...(p.items ?? []));
    progress.cont = p.metadata?.continue || p.metadata?._continue || undefined;
    progress.resourceVersion = p.metadata?.resourceVersion ?? progress.resourceVersion;
  } while (progress.cont);
  return { items: progress.items, resourceVersion: progress.resourceVersion };
}

/**
 * Deletes a Secret only if it is still the version that was read (resourceVersion and uid
 * preconditions), so a mirror that gained a user meanwhile is never deleted (SPEC §6).
 * @returns true when deleted, false when it was already gone.
 * @throws the 409 when it changed (the caller re-reads), and any other API error.
 */
export async function deleteSecretIfUnchanged(
  clients: Clients,
  secret: { metadata?: { name?: string; namespace?: string; resourceVersion?: string; uid?: string } },
): Promise<boolean> {
  const md = secret.metadata ?? {};
  try {
    await clients.core.deleteNamespacedSecret({
      name: md.name!,
      namespace: md.namespace!,
      body: { preconditions: { resourceVersion: md.resourceVersion!, uid: md.uid! } },
    });
    return true;
  } catch (err) {
    if (isNotFound(err)) return false;
    throw err;
  }
}
