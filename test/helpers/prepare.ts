/**
 * The provider's manager as tests play it (SPEC §5): a ServiceAccount bound to the shipped
 * `captf-prepare` ClusterRole (read from manifests/, scripts/lib/serviceaccount.ts) with a token
 * for the audience `captf-mirror-sync`, and the one way tests call `POST /prepare`.
 */
import type { V1PolicyRule } from '@kubernetes/client-node';
import type { Consumer } from '../../functions/lib/api.ts';
import { prepareCaller, type PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { suffix } from './cluster.ts';
import * as fx from './fixtures.ts';

/** The name the manifests bind the prepare role to (manifests/base/rbac/prepare.yaml). */
export const MANAGER_SERVICE_ACCOUNT = 'captf-controller-manager';

/**
 * A manager allowed to call prepare: ServiceAccount `captf-controller-manager` in a fresh
 * namespace of the world `w`, bound to a copy of the shipped prepare role (plus `extraRules`
 * for a test's own consumer kind), with an audience-bound token. Its RBAC is removed with the
 * world's objects.
 */
export async function manager(
  w: Pick<fx.World, 'clients' | 'namespace' | 'onCleanup'>,
  opts: { extraRules?: V1PolicyRule[]; audience?: string } = {},
): Promise<PrepareCaller> {
  const namespace = await w.namespace();
  const caller = await prepareCaller(w.clients.kc, {
    namespace,
    name: MANAGER_SERVICE_ACCOUNT,
    suffix: suffix(),
    ...opts,
  });
  w.onCleanup(caller.cleanup);
  return caller;
}

/** What prepare is asked about: the consumer's apiVersion, kind, namespace and name (a built or a read consumer). */
export const prepareTarget = (c: Consumer) => ({
  apiVersion: c.apiVersion,
  kind: c.kind,
  namespace: c.metadata.namespace,
  name: c.metadata.name,
});

/** An answer of prepare: status, the raw text, the parsed JSON (or `{}`), and the headers. */
export interface PrepareAnswer {
  status: number;
  text: string;
  body: Record<string, string>;
  headers: Headers;
}

/**
 * `POST <base>/prepare` with `body` (an object is sent as JSON, a string as is).
 * @param auth the caller (its token goes in `Authorization: Bearer`), a raw `Authorization`
 *   header value, or undefined for none.
 * @param signal aborts the request (the promise then rejects).
 */
export async function postPrepare(
  base: string,
  body: unknown,
  auth: PrepareCaller | string | undefined,
  signal?: AbortSignal,
): Promise<PrepareAnswer> {
  const authorization = typeof auth === 'string' ? auth : auth?.authorization;
  const res = await fetch(`${base.replace(/\/$/, '')}/prepare`, {
    method: 'POST',
    ...(signal ? { signal } : {}),
    headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: Record<string, string> = {};
  try {
    parsed = JSON.parse(text) as Record<string, string>;
  } catch {
    // not JSON: the caller asserts on `text`
  }
  return { status: res.status, text, body: parsed, headers: res.headers };
}
