/**
 * The scripts' ways of writing objects, as kubectl's: create unless it exists, and forced
 * server-side apply (`kubectl apply --server-side --force-conflicts`), of an object in
 * client-node's models' terms or of one as YAML spells it ({@link WireObjects}).
 */
import { request, type RequestOptions } from 'node:https';
import {
  KubernetesObjectApi,
  PatchStrategy,
  ServerConfiguration,
  createConfiguration,
  type KubeConfig,
  type KubernetesObject,
} from '@kubernetes/client-node';
import { isConflict } from '../../functions/lib/kube.ts';

/** Awaits a create, taking 409 (AlreadyExists) as done. @throws every other error of `create`. */
export async function createOnce(create: Promise<unknown>): Promise<void> {
  await create.catch((err: unknown) => {
    if (!isConflict(err)) throw err;
  });
}

/** `<Kind> [<namespace>/]<name>`: an object named in a message. */
export const objectName = (o: KubernetesObject): string =>
  `${o.kind} ${o.metadata?.namespace ? `${o.metadata.namespace}/` : ''}${o.metadata?.name}`;

/** An answer of the API server: its status code and body text. */
export interface WireAnswer {
  status: number;
  body: string;
}

/**
 * Writes objects exactly as given, as JSON (no client-node model in between), at the URL
 * client-node's discovery gives for each: for objects as YAML spells them (kustomize's output).
 * client-node's typed writers serialize through models that rename a few fields (a NetworkPolicy
 * rule's `from` is `_from`), so such an object loses those fields without a word
 * (kubernetes-client/javascript issue 2825).
 */
export class WireObjects extends KubernetesObjectApi {
  readonly #kc: KubeConfig;
  constructor(kc: KubeConfig) {
    super(
      createConfiguration({
        baseServer: new ServerConfiguration(kc.getCurrentCluster()!.server, {}),
        authMethods: { default: kc },
      }),
    );
    this.#kc = kc;
  }

  /** POST: creates `o`; `query` is added to the URL (e.g. `dryRun=All`). Never throws for an HTTP status. */
  async createAsSpelled(o: KubernetesObject, query: string): Promise<WireAnswer> {
    return this.send('POST', `${await this.specUriPath(o, 'create')}?${query}`, o, 'application/json');
  }

  /** PATCH: server-side apply of `o`; `query` must name the field manager. Never throws for an HTTP status. */
  async applyAsSpelled(o: KubernetesObject, query: string): Promise<WireAnswer> {
    return this.send('PATCH', `${await this.specUriPath(o, 'patch')}?${query}`, o, 'application/apply-patch+yaml');
  }

  private async send(method: string, path: string, o: KubernetesObject, contentType: string): Promise<WireAnswer> {
    const url = new URL(path, this.#kc.getCurrentCluster()!.server);
    const opts: RequestOptions = { method, headers: { 'content-type': contentType, accept: 'application/json' } };
    await this.#kc.applyToHTTPSOptions(opts);
    return new Promise((resolve, reject) => {
      const req = request(url, opts, (r) => {
        let text = '';
        r.on('data', (d: Buffer) => (text += d.toString()));
        r.on('end', () => resolve({ status: r.statusCode ?? 0, body: text }));
      });
      req.on('error', reject);
      req.end(JSON.stringify(o));
    });
  }
}

/**
 * Server-side apply of one object as `fieldManager`, forced (its fields become this manager's),
 * through client-node's typed writer: for objects in its models' terms (loadAllYaml's, or
 * literals typed against them). An object as YAML spells it goes through {@link applyAsRendered}.
 * @returns the object as stored.
 * @throws Error `applying <Kind> [<namespace>/]<name>: <the API server's answer>`, caused by the API error.
 */
export async function serverSideApply<T extends KubernetesObject>(
  kc: KubeConfig,
  obj: T,
  fieldManager: string,
): Promise<T> {
  return (await KubernetesObjectApi.makeApiClient(kc)
    .patch(obj, undefined, undefined, fieldManager, true, PatchStrategy.ServerSideApply)
    .catch((err: { body?: string; message: string }) => {
      throw new Error(`applying ${objectName(obj)}: ${err.body ?? err.message}`, { cause: err });
    })) as T;
}

/**
 * Forced server-side apply of one object as YAML spells it (kustomize's output, js-yaml's), sent
 * exactly so ({@link WireObjects}), as `kubectl apply --server-side --force-conflicts` does.
 * @returns the object as stored.
 * @throws Error `applying <Kind> [<namespace>/]<name>: <the API server's answer>`, caused by an
 *   error carrying `code` (the HTTP status) and `body`.
 */
export async function applyAsRendered<T extends KubernetesObject>(
  kc: KubeConfig,
  obj: T,
  fieldManager: string,
): Promise<T> {
  const query = `fieldManager=${encodeURIComponent(fieldManager)}&force=true`;
  const r = await new WireObjects(kc).applyAsSpelled(obj, query).catch((err: Error) => {
    throw new Error(`applying ${objectName(obj)}: ${err.message}`, { cause: err });
  });
  if (r.status >= 200 && r.status < 300) return JSON.parse(r.body) as T;
  const cause = Object.assign(new Error(`HTTP ${r.status}`), { code: r.status, body: r.body });
  throw new Error(`applying ${objectName(obj)}: ${r.body || cause.message}`, { cause });
}
