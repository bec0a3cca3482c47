/**
 * The scripts' two ways of writing objects, as kubectl's: create unless it exists, and forced
 * server-side apply (`kubectl apply --server-side --force-conflicts`).
 */
import { KubernetesObjectApi, PatchStrategy, type KubeConfig, type KubernetesObject } from '@kubernetes/client-node';
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

/**
 * Server-side apply of one object as `fieldManager`, forced (its fields become this manager's).
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
