/**
 * The provider's manager as tests play it (SPEC §5): a ServiceAccount bound to the shipped
 * `captf-prepare` ClusterRole (read from manifests/, scripts/lib/serviceaccount.ts) with a token
 * for the audience `captf-mirror-sync`, and the one way tests call `POST /prepare`.
 */
import type { V1PolicyRule } from '@kubernetes/client-node';
import { prepareCaller, type PrepareCaller } from '../../scripts/lib/serviceaccount.ts';
import { admin, suffix } from './cluster.ts';

/** The name the manifests bind the prepare role to (manifests/base/rbac/prepare.yaml). */
export const MANAGER_SERVICE_ACCOUNT = 'captf-controller-manager';

/**
 * A manager allowed to call prepare: ServiceAccount `captf-controller-manager` in a fresh
 * namespace of `ns`, bound to a copy of the shipped prepare role (plus `extraRules` for a
 * test's own consumer kind), with an audience-bound token. Its RBAC is removed with the
 * file's namespaces.
 * @param ns the file's namespace creator (cluster.ts `namespaces`).
 */
export async function manager(
  ns: { create(): Promise<string>; onCleanup(fn: () => Promise<unknown>): void },
  opts: { extraRules?: V1PolicyRule[]; audience?: string } = {},
): Promise<PrepareCaller> {
  const namespace = await ns.create();
  const caller = await prepareCaller(admin().kc, {
    namespace,
    name: MANAGER_SERVICE_ACCOUNT,
    suffix: suffix(),
    ...opts,
  });
  ns.onCleanup(caller.cleanup);
  return caller;
}

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
 */
export async function postPrepare(
  base: string,
  body: unknown,
  auth: PrepareCaller | string | undefined,
): Promise<PrepareAnswer> {
  const authorization = typeof auth === 'string' ? auth : auth?.authorization;
  const res = await fetch(`${base.replace(/\/$/, '')}/prepare`, {
    method: 'POST',
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
