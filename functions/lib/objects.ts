/**
 * Typed access to the project's custom objects (SPEC §1): identities and consumers through the
 * custom-object API, addressed from one {@link ResourceKind} so no caller spells a group,
 * version or plural. Every call is one API request; nothing is cached. Objects read come back
 * with `apiVersion` and `kind` filled in (list items may omit them).
 */
import { PatchStrategy, setHeaderOptions, type ConfigurationOptions } from '@kubernetes/client-node';
import {
  FIELD_MANAGER,
  IDENTITY_RESOURCE,
  type Consumer,
  type ConsumerKind,
  type ObjectMeta,
  type ResourceKind,
  type TerraformClusterIdentity,
} from './api.ts';
import type { Clients, ListPage } from './kube.ts';

/** Where an object is: its name, and its namespace unless it is cluster-scoped. */
export interface ObjectAddress {
  name: string;
  namespace?: string | undefined;
}

/** The list options this project passes (a subset of the API's). */
export interface ListOptions {
  /** One namespace; absent: all namespaces (or a cluster-scoped kind). */
  namespace?: string | undefined;
  labelSelector?: string | undefined;
  fieldSelector?: string | undefined;
  limit?: number | undefined;
  _continue?: string | undefined;
}

/** An object of the project's API: metadata plus any body. */
export interface CustomObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
}

/** A server-side apply body for a status subresource: the object's address and the status fields owned. */
export interface StatusApply {
  apiVersion?: string;
  kind?: string;
  metadata: Pick<ObjectMeta, 'name' | 'namespace' | 'resourceVersion'>;
  status: object;
}

/** One kind's objects through the custom-object API. Each method is one request and throws its API error. */
export interface CustomObjects<T extends CustomObject> {
  /** The kind these objects are. */
  readonly resource: ResourceKind;
  /** GET one object. @throws the API error (404 when absent). */
  get(at: ObjectAddress): Promise<T>;
  /** One page of a list. */
  list(opts?: ListOptions): Promise<ListPage<T>>;
  /** POST `body` (its namespace from `metadata.namespace`); `apiVersion` and `kind` are filled in. */
  create(body: Omit<T, 'apiVersion' | 'kind'>): Promise<T>;
  /** PUT `body` (with `metadata.resourceVersion` as the precondition, when given). */
  replace(body: Omit<T, 'apiVersion' | 'kind'>): Promise<T>;
  /** DELETE one object. */
  delete(at: ObjectAddress): Promise<void>;
  /**
   * Server-side apply of `body` on the status subresource as `fieldManager` (default
   * {@link FIELD_MANAGER}), forcing ownership (SPEC §4); `metadata.resourceVersion`, when
   * given, is a precondition.
   */
  applyStatus(body: StatusApply, fieldManager?: string): Promise<T>;
  /**
   * JSON patch (RFC 6902) of the status subresource as {@link FIELD_MANAGER}: for what server-side
   * apply cannot do (remove a list item another manager also claims). Its `test` operations are
   * the preconditions (a failed one answers 422).
   */
  patchStatus(at: ObjectAddress, ops: readonly JsonPatchOp[]): Promise<T>;
}

/** One RFC 6902 operation of those this project sends. */
export type JsonPatchOp = { op: 'test'; path: string; value: unknown } | { op: 'remove'; path: string };

const APPLY: ConfigurationOptions = setHeaderOptions('Content-Type', PatchStrategy.ServerSideApply);
const JSON_PATCH: ConfigurationOptions = setHeaderOptions('Content-Type', PatchStrategy.JsonPatch);

/** What the accessors need of a client set: only the custom-object API. */
export type CustomClients = Pick<Clients, 'custom'>;

/** Typed access to the objects of `resource` (SPEC §1 kinds, or a configured consumer kind). */
export function customObjects<T extends CustomObject>(
  clients: CustomClients,
  resource: ResourceKind,
): CustomObjects<T> {
  const { group, version, plural, kind } = resource;
  const apiVersion = `${group}/${version}`;
  const where = { group, version, plural };
  const typed = (o: unknown) => ({ ...(o as T), apiVersion, kind }) as T;
  const full = (body: object) => ({ ...body, apiVersion, kind });
  const custom = clients.custom;
  return {
    resource,
    async get({ name, namespace }) {
      return typed(
        await (namespace
          ? custom.getNamespacedCustomObject({ ...where, namespace, name })
          : custom.getClusterCustomObject({ ...where, name })),
      );
    },
    async list({ namespace, ...opts } = {}) {
      const page = (await (namespace
        ? custom.listNamespacedCustomObject({ ...where, ...opts, namespace })
        : custom.listClusterCustomObject({ ...where, ...opts }))) as ListPage<T>;
      return { ...page, items: page.items?.map(typed) };
    },
    async create(body) {
      const namespace = body.metadata.namespace;
      return typed(
        await (namespace
          ? custom.createNamespacedCustomObject({ ...where, namespace, body: full(body) })
          : custom.createClusterCustomObject({ ...where, body: full(body) })),
      );
    },
    async replace(body) {
      const { name, namespace } = body.metadata;
      const at = { ...where, name: name!, body: full(body) };
      return typed(
        await (namespace
          ? custom.replaceNamespacedCustomObject({ ...at, namespace })
          : custom.replaceClusterCustomObject(at)),
      );
    },
    async delete({ name, namespace }) {
      await (namespace
        ? custom.deleteNamespacedCustomObject({ ...where, namespace, name })
        : custom.deleteClusterCustomObject({ ...where, name }));
    },
    async applyStatus({ metadata, ...rest }, fieldManager = FIELD_MANAGER) {
      const at = { name: metadata.name!, namespace: metadata.namespace };
      const body = full({ metadata, ...rest });
      return typed(await patchStatus(clients, resource, at, { body, fieldManager, force: true, contentType: APPLY }));
    },
    async patchStatus(at, ops) {
      const req = { body: ops, fieldManager: FIELD_MANAGER, contentType: JSON_PATCH };
      return typed(await patchStatus(clients, resource, at, req));
    },
  };
}

/** PATCH of an object's status subresource, at cluster scope when it has no namespace. */
function patchStatus(
  { custom }: CustomClients,
  { group, version, plural }: ResourceKind,
  { name, namespace }: ObjectAddress,
  req: { body: unknown; fieldManager: string; force?: boolean; contentType: ConfigurationOptions },
): Promise<object> {
  const { contentType, ...params } = req;
  const where = { group, version, plural };
  return namespace
    ? custom.patchNamespacedCustomObjectStatus({ ...where, ...params, name, namespace }, contentType)
    : custom.patchClusterCustomObjectStatus({ ...where, ...params, name }, contentType);
}

/** The TerraformClusterIdentities (cluster-scoped, SPEC §1). */
export const identities = (clients: CustomClients): CustomObjects<TerraformClusterIdentity> =>
  customObjects<TerraformClusterIdentity>(clients, IDENTITY_RESOURCE);

/** The consumers of one kind (namespaced, SPEC §1). */
export const consumerObjects = (clients: CustomClients, kind: ConsumerKind): CustomObjects<Consumer> =>
  customObjects<Consumer>(clients, kind);
