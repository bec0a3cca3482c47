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
  IsomorphicFetchHttpLibrary,
  KubeConfig,
  KubernetesObjectApi,
  ServerConfiguration,
  createConfiguration,
  wrapHttpLibrary,
  type Configuration,
  type HttpLibrary,
  type RequestContext,
  type ResponseContext,
  setHeaderOptions,
  PatchStrategy,
  type ConfigurationOptions,
} from '@kubernetes/client-node';
import { pooledAuthentication } from './api-pool.ts';
import {
  apiStatus,
  rememberRequest,
  requestAttributes,
  requestOf,
  sentBody,
  usernameFromCredentials,
  type RequestAttributes,
} from './api-errors.ts';
import type { Logger } from './log.ts';
import { recording, telemetry } from './telemetry.ts';

/**
 * Request options asking the API server for metadata only (`PartialObjectMetadata`, see
 * Kubernetes "API concepts: receiving resources as tables/metadata"): RBAC is the same as a
 * normal get, but no Secret data is ever sent to the function.
 */
export const METADATA: ConfigurationOptions = setHeaderOptions(
  'Accept',
  'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1',
);
/** Request options for a strategic-merge patch (the merge a write that commutes is, SPEC §4). */
export const STRATEGIC_MERGE: ConfigurationOptions = setHeaderOptions(
  'Content-Type',
  PatchStrategy.StrategicMergePatch,
);

/** {@link METADATA} for list calls (`PartialObjectMetadataList`). */
export const METADATA_LIST: ConfigurationOptions = setHeaderOptions(
  'Accept',
  'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1',
);

// Errors become text in one place only (SPEC §15): api-errors.ts.
export {
  apiStatus,
  describeError,
  isInvalidField,
  redactApiError,
  RedactedApiError,
  retryAfterOf,
} from './api-errors.ts';

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
  /** TokenReviews (mirror-sync's prepare checks its callers, SPEC §5). */
  authn: AuthenticationV1Api;
  events: EventsV1Api;
  /** Discovery of a kind's resource (scope, plural). */
  discovery: Discovery;
  counter: CallCounter;
  /** Where library code warns about what it did on its own (a list restarted); none in some tests. */
  logger?: Logger | undefined;
}

/**
 * Builds the API clients on `kc`, counting every request in `counter`. Every client of the
 * process shares one kept-alive connection pool per TLS identity (api-pool.ts). A failed
 * request is recorded with its error (what was asked, and for a 403 who asked) so that
 * `describeError` can say it without quoting the answer (api-errors.ts).
 * @param counter shared counter (a fresh one when omitted); reset it per reconcile.
 * @param logger the function's logger, for the warnings of library code ({@link listAllPages}).
 * @throws Error when the kubeconfig has no current cluster.
 */
export function makeClients(kc: KubeConfig, counter: CallCounter = { calls: 0 }, logger?: Logger): Clients {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('kubeconfig has no current cluster');
  const config: Configuration = createConfiguration({
    baseServer: new ServerConfiguration(cluster.server, {}),
    httpApi: recordingHttpApi(kc, cluster.server),
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
    authn: new AuthenticationV1Api(config),
    events: new EventsV1Api(config),
    discovery: new Discovery(config),
    counter,
    logger,
  };
}

/**
 * client-node's discovery of one kind (`GET /apis/<group>/<version>`, remembered per
 * group/version by the instance), which it keeps protected behind its generic object client.
 */
export class Discovery extends KubernetesObjectApi {
  /**
   * The served resource of `kind` in `apiVersion` (its plural as `name`, and `namespaced`).
   * @returns undefined when the group/version serves no such kind. @throws the API error
   *   (404 when the group/version is not served at all).
   */
  resourceOf(apiVersion: string, kind: string): ReturnType<KubernetesObjectApi['resource']> {
    return this.resource(apiVersion, kind);
  }
}

/** The API answered 404. */
export const isNotFound = (err: unknown): boolean => apiStatus(err) === 404;
/** The API answered 409 (resourceVersion precondition failed, or already exists). */
export const isConflict = (err: unknown): boolean => apiStatus(err) === 409;
/** The API answered 403. */
export const isForbidden = (err: unknown): boolean => apiStatus(err) === 403;

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

const users = new WeakMap<KubeConfig, Promise<string | undefined>>();

/**
 * The user this process acts as, for messages that say who was refused: read from its own
 * credentials (api-errors.ts `usernameFromCredentials`: a ServiceAccount token's subject, a
 * client certificate's CN), never asked of the API server, whose answer a proxy could forge.
 * @returns the username, or undefined when the credentials do not tell it (never throws).
 */
export function whoAmI(kc: KubeConfig): Promise<string | undefined> {
  let user = users.get(kc);
  if (!user) {
    user = ownCredentials(kc).then(usernameFromCredentials, () => undefined);
    users.set(kc, user);
  }
  return user;
}

/** The bearer token and client certificate `kc` sends. */
async function ownCredentials(kc: KubeConfig): Promise<{ bearer?: string; certPem?: string }> {
  const opts: { headers?: Record<string, unknown>; cert?: unknown } = {};
  await kc.applyToHTTPSOptions(opts);
  const auth = opts.headers?.Authorization ?? opts.headers?.authorization;
  const cert = opts.cert;
  return {
    ...(typeof auth === 'string' && /^Bearer\s+/i.test(auth) ? { bearer: auth.replace(/^Bearer\s+/i, '') } : {}),
    ...(typeof cert === 'string' || Buffer.isBuffer(cert) ? { certPem: cert.toString() } : {}),
  };
}

/**
 * client-node's HTTP library with a record of each failed request (api-errors.ts
 * `rememberRequest`): what it asked, parsed from its own method and URL, and for a 403 this
 * process's user, so an error's text can name them without quoting the answer. With telemetry
 * on, each request is also a span and a count ({@link observed}).
 */
function recordingHttpApi(kc: KubeConfig, server: string): HttpLibrary {
  const inner = new IsomorphicFetchHttpLibrary();
  const basePath = new URL(server).pathname;
  const attributes = (request: RequestContext, user?: string) => (): RequestAttributes | undefined => {
    const r = requestAttributes(request.getHttpMethod(), request.getUrl(), basePath);
    return r && { ...r, ...sentBody(request.getBody()), ...(user ? { user } : {}) };
  };
  const remembering = async (request: RequestContext): Promise<ResponseContext> => {
    let response: ResponseContext;
    try {
      response = await inner.send(request).toPromise();
    } catch (err) {
      if (typeof err === 'object' && err !== null) rememberRequest(err, attributes(request));
      throw err;
    }
    if (response.httpStatusCode >= 400) {
      const user = response.httpStatusCode === 403 ? await whoAmI(kc) : undefined;
      rememberRequest(response.headers, attributes(request, user));
    }
    return response;
  };
  return wrapHttpLibrary({
    send: (request) => (recording() ? observed(request, basePath, remembering) : remembering(request)),
  });
}

/**
 * Sends one API request in a client span named `<verb> <resource>[/<subresource>]` that passes
 * its trace context on (`traceparent`), and counts its verb, resource, code and duration
 * (./telemetry.ts). Names stay in the span; the count holds none.
 */
async function observed(
  request: RequestContext,
  basePath: string,
  send: (request: RequestContext) => Promise<ResponseContext>,
): Promise<ResponseContext> {
  const r = requestAttributes(request.getHttpMethod(), request.getUrl(), basePath);
  const verb = r?.verb ?? 'other';
  const resource = r ? (r.subresource ? `${r.resource}/${r.subresource}` : r.resource) : 'other';
  const attributes = {
    'http.request.method': request.getHttpMethod(),
    'captf.verb': verb,
    'captf.resource': resource,
    ...(r?.namespace ? { 'k8s.namespace.name': r.namespace } : {}),
    ...(r?.name ? { 'captf.name': r.name } : {}),
  };
  const started = performance.now();
  return telemetry().span(`${verb} ${resource}`, { kind: 'client', attributes, leaf: true }, async (span) => {
    span.inject((name, value) => request.setHeaderParam(name, value));
    let status: number | undefined;
    try {
      const response = await send(request);
      status = response.httpStatusCode;
      span.set({ 'http.response.status_code': status });
      if (status >= 500) span.fail(`answered ${status}`);
      return response;
    } finally {
      telemetry().apiRequest(verb, resource, status, (performance.now() - started) / 1000);
    }
  });
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
 * (410 Gone) restarts the list from the first page, at most {@link LIST_RESTARTS} times, each
 * restart one warning naming the list and the attempt: a partial list is never returned as if
 * it were whole.
 * @param page fetches one page for a continue token (undefined = first page).
 * @param logger where a restart is said (usually the clients' `logger`).
 * @param keep what to keep of each item, applied as each page arrives, so a long list holds
 *   only that, never every page's whole objects at once (default: the item itself).
 * @returns every item (as kept) and the resourceVersion of the list's last page.
 * @throws the 410 when restarts run out, and any other API error of a page.
 */
export async function listAllPages<T, K = T>(
  page: (cont: string | undefined) => Promise<ListPage<T>>,
  logger?: Logger,
  keep: (item: T) => K = (item) => item as unknown as K,
): Promise<{ items: K[]; resourceVersion: string }> {
  for (let restart = 0; ; restart++) {
    const progress = { items: [] as K[], cont: undefined as string | undefined, resourceVersion: '' };
    try {
      return await readPages(page, progress, keep);
    } catch (err) {
      if (apiStatus(err) !== 410 || progress.cont === undefined || restart >= LIST_RESTARTS) throw err;
      logger?.warn('list restarted from its first page: its continue token expired', {
        list: listName(err),
        attempt: restart + 2,
        attempts: LIST_RESTARTS + 1,
      });
    }
  }
}

/** The list a failed page belonged to, from what was asked (`secrets in team-a`), or `a list` when unknown. */
function listName(err: unknown): string {
  const r = requestOf(err);
  if (!r) return 'a list';
  const resource = r.group ? `${r.resource}.${r.group}` : r.resource;
  return r.namespace ? `${resource} in ${r.namespace}` : resource;
}

/** Reads pages into `progress` until the last; `progress.cont` tells a caller how far it got. */
async function readPages<T, K>(
  page: (cont: string | undefined) => Promise<ListPage<T>>,
  progress: { items: K[]; cont: string | undefined; resourceVersion: string },
  keep: (item: T) => K,
): Promise<{ items: K[]; resourceVersion: string }> {
  do {
    const p = await page(progress.cont);
    for (const item of p.items ?? []) progress.items.push(keep(item));
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
