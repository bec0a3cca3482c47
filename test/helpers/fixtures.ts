/**
 * The one vocabulary tests use for the project's objects, imported whole:
 * `import * as fx from '../helpers/fixtures.ts'`.
 *
 * - **Builders**, one per kind (`identity`, `consumer`, `sourceSecret`, `namespace`), each
 *   taking a name and modifiers (`secretRef`, `allowList`, `identityRef`, `inNamespace`,
 *   `labels`, …). They are pure: unit tests pass what they build straight to a decision.
 *   (After cert-manager's `test/unit/gen`.)
 * - **A world** per test file (`world(prefix)`): creates what the builders make in the shared
 *   control plane as admin, gives fresh namespaces and unique names, runs a function's
 *   client as its ServiceAccount with the RBAC the rendered manifests give it, and deletes
 *   everything after the file's tests, after scanning for leaked Secret values.
 * - **Rows** (`rows(table, check)`): one test per row of inputs and wanted outcome, instead
 *   of a set-up per test. (After knative/pkg's `reconciler/testing` TableRow.)
 */
import assert from 'node:assert/strict';
import { after, it } from 'node:test';
import type {
  KubernetesObject,
  V1Container,
  V1Job,
  V1Namespace,
  V1PodSpec,
  V1PolicyRule,
  V1Secret,
} from '@kubernetes/client-node';
import {
  API_VERSION,
  DEFAULT_CONSUMER_KINDS,
  IDENTITY_KIND,
  TERRAFORM_CLUSTER,
  type Condition,
  type Consumer,
  type ConsumerKind,
  type LabelSelector,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { findConsumerKind } from '../../functions/lib/consumers.ts';
import { ignoreNotFound, isNotFound, makeClients, retryOnConflict, type Clients } from '../../functions/lib/kube.ts';
import { consumerObjects, identities, type CustomObjects } from '../../functions/lib/objects.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { installRbac, serviceAccountKubeConfig } from '../../scripts/lib/serviceaccount.ts';
import { render } from '../../scripts/tools/kustomize.ts';
import { admin, controlPlaneDir, eventually, suffix } from './cluster.ts';
import { clusterLeaks, outputLeaks } from './leaks.ts';

// ---------------------------------------------------------------------------------------------
// Builders and modifiers
// ---------------------------------------------------------------------------------------------

/** Changes a freshly built object in place. */
export type Modifier<T> = (o: T) => void;

/** The metadata every modifier below may touch (both `ObjectMeta` and `V1ObjectMeta` fit). */
interface Meta {
  metadata?: {
    namespace?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    finalizers?: string[];
    ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string }[];
  };
}

/** Applies `mods` to `o` in order; returns it. */
const build = <T>(o: T, mods: readonly Modifier<T>[]): T => {
  for (const m of mods) m(o);
  return o;
};

/** The object's namespace. */
export const inNamespace =
  (namespace: string): Modifier<Meta> =>
  (o) => {
    o.metadata = { ...o.metadata, namespace };
  };

/** Adds labels. */
export const labels =
  (values: Record<string, string>): Modifier<Meta> =>
  (o) => {
    o.metadata = { ...o.metadata, labels: { ...o.metadata?.labels, ...values } };
  };

/** Adds annotations. */
export const annotations =
  (values: Record<string, string>): Modifier<Meta> =>
  (o) => {
    o.metadata = { ...o.metadata, annotations: { ...o.metadata?.annotations, ...values } };
  };

/** Sets finalizers (they keep a deleted object Terminating). */
export const finalizers =
  (...names: string[]): Modifier<Meta> =>
  (o) => {
    o.metadata = { ...o.metadata, finalizers: names };
  };

/** Adds an owner reference to `owner` (as read back from the API server, so with its uid). */
export const ownedBy =
  (owner: { apiVersion?: string; kind?: string; metadata?: { name?: string; uid?: string } }): Modifier<Meta> =>
  (o) => {
    const ref = {
      apiVersion: owner.apiVersion!,
      kind: owner.kind!,
      name: owner.metadata!.name!,
      uid: owner.metadata!.uid!,
    };
    o.metadata = { ...o.metadata, ownerReferences: [...(o.metadata?.ownerReferences ?? []), ref] };
  };

/** Sets `status.conditions` (for decisions that read them; the API server ignores status on create). */
export const conditions =
  (...list: Condition[]): Modifier<{ status?: { conditions?: Condition[] } }> =>
  (o) => {
    o.status = { ...o.status, conditions: list };
  };

/** `metadata.generation` and `metadata.resourceVersion` as the API server would have set them (for decisions that read them). */
export const stored =
  (
    generation: number,
    resourceVersion: string,
  ): Modifier<{ metadata?: { generation?: number; resourceVersion?: string } }> =>
  (o) => {
    o.metadata = { ...o.metadata, generation, resourceVersion };
  };

/** The source Secret an identity names (SPEC §1); without this modifier `identity()` names `captf-system/creds`. */
export const secretRef =
  (namespace: string, name: string): Modifier<TerraformClusterIdentity> =>
  (o) => {
    o.spec.secretRef = { namespace, name };
  };

/** `spec.allowedNamespaces.list`. */
export const allowList =
  (...namespaces: string[]): Modifier<TerraformClusterIdentity> =>
  (o) => {
    o.spec.allowedNamespaces = { list: namespaces };
  };

/** `spec.allowedNamespaces.selector`; called without an argument, the empty selector, which allows every namespace. */
export const allowSelector =
  (selector: LabelSelector = {}): Modifier<TerraformClusterIdentity> =>
  (o) => {
    o.spec.allowedNamespaces = { selector };
  };

/** `spec.allowedNamespaces` as given, valid or not (null and `{}` included); `undefined` removes it. */
export const allowedNamespaces =
  (value: unknown): Modifier<TerraformClusterIdentity> =>
  (o) => {
    if (value === undefined) delete o.spec.allowedNamespaces;
    else o.spec.allowedNamespaces = value as TerraformClusterIdentity['spec']['allowedNamespaces'];
  };

/** The identity's whole `spec` as given, valid or not (any value, a missing one included): for validation and hostile input. */
export const identitySpec =
  (value: unknown): Modifier<TerraformClusterIdentity> =>
  (o) => {
    o.spec = value as TerraformClusterIdentity['spec'];
  };

/**
 * Every valid form of `spec.allowedNamespaces` (SPEC §2), for {@link allowedNamespaces}: absent,
 * null, an empty list, a list, the empty selector, and a list with a selector.
 */
export const VALID_ALLOWED_NAMESPACES: readonly unknown[] = Object.freeze([
  undefined,
  null,
  { list: [] },
  { list: ['a'] },
  { selector: {} },
  { list: ['a'], selector: { matchLabels: { 'x.io/y': 'z' } } },
]);

/** `status.namespaces`: where the identity is in use (SPEC §9; the API server ignores status on create). */
export const inUseIn =
  (...namespaces: string[]): Modifier<TerraformClusterIdentity> =>
  (o) => {
    o.status = { ...o.status, namespaces };
  };

/** `metadata.deletionTimestamp`: the object is being deleted (for decisions that read it; the API server sets it itself). */
export const deleting =
  (timestamp = 'now'): Modifier<{ metadata?: { deletionTimestamp?: string | Date } }> =>
  (o) => {
    o.metadata = { ...o.metadata, deletionTimestamp: timestamp };
  };

/** The `apiVersion` (`group/version`) of objects of `kind`, e.g. of `TERRAFORM_CLUSTER` or `IDENTITY_RESOURCE`. */
export const apiVersionOf = (kind: { group: string; version: string }): string => `${kind.group}/${kind.version}`;

/** `metadata.uid` as the API server would have set it (for decisions that read it, e.g. owner references). */
export const uid =
  (value: string): Modifier<{ metadata?: { uid?: string } }> =>
  (o) => {
    o.metadata = { ...o.metadata, uid: value };
  };

/**
 * A TerraformClusterIdentity (SPEC §1) named `name`, with source `captf-system/creds` and no
 * `allowedNamespaces` (allows nothing) unless modifiers say otherwise.
 */
export function identity(name: string, ...mods: Modifier<TerraformClusterIdentity>[]): TerraformClusterIdentity {
  return build<TerraformClusterIdentity>(
    {
      apiVersion: API_VERSION,
      kind: IDENTITY_KIND,
      metadata: { name },
      spec: { secretRef: { namespace: 'captf-system', name: 'creds' } },
    },
    mods,
  );
}

/** The identity a consumer names (`spec.identityRef.name`); no argument removes the reference. */
export const identityRef =
  (name?: string): Modifier<Consumer> =>
  (o) => {
    o.spec = name === undefined ? {} : { ...o.spec, identityRef: { name } };
  };

/** The consumer's kind (default TerraformCluster). */
export const ofKind =
  (kind: ConsumerKind): Modifier<Consumer> =>
  (o) => {
    o.apiVersion = `${kind.group}/${kind.version}`;
    o.kind = kind.kind;
  };

/** More fields of a consumer's spec (a provider's own, which the project must keep). */
export const consumerSpec =
  (fields: Record<string, unknown>): Modifier<Consumer> =>
  (o) => {
    o.spec = { ...o.spec, ...fields };
  };

/** A consumer (SPEC §1) named `name`: a TerraformCluster naming no identity unless modifiers say otherwise. */
export function consumer(name: string, ...mods: Modifier<Consumer>[]): Consumer {
  return build<Consumer>({ apiVersion: API_VERSION, kind: TERRAFORM_CLUSTER.kind, metadata: { name }, spec: {} }, mods);
}

/** Secret values, given as plain strings (stored base64-encoded in `data`). */
export const data =
  (values: Record<string, string>): Modifier<V1Secret> =>
  (o) => {
    o.data = Object.fromEntries(Object.entries(values).map(([k, v]) => [k, Buffer.from(v).toString('base64')]));
  };

/** The same `data` as `secret` (as read back: a look-alike of a source carries its values, planted ones included). */
export const dataOf =
  (secret: V1Secret): Modifier<V1Secret> =>
  (o) => {
    o.data = { ...secret.data };
  };

/** The Secret's type (default Opaque). */
export const secretType =
  (type: string): Modifier<V1Secret> =>
  (o) => {
    o.type = type;
  };

/**
 * An operator's source Secret named `name`, with one key `token` unless modifiers say
 * otherwise. (Created through `world`, every Secret also carries the run's planted value,
 * which no output may ever show: leaks.ts.)
 */
export function sourceSecret(name: string, ...mods: Modifier<V1Secret>[]): V1Secret {
  return build<V1Secret>(
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name },
      type: 'Opaque',
      data: { token: Buffer.from(`token-of-${name}`).toString('base64') },
    },
    mods,
  );
}

/** A Namespace named `name`. */
export function namespace(name: string, ...mods: Modifier<V1Namespace>[]): V1Namespace {
  return build<V1Namespace>({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } }, mods);
}

/**
 * The mirror of identity `identityName` (SPEC §3), as far as its name: with `inNamespace(ns)`,
 * what `w.read` and `w.delete` address (mirror-sync writes mirrors; tests look them up).
 */
export function mirrorOf(identityName: string, ...mods: Modifier<V1Secret>[]): V1Secret {
  return build<V1Secret>({ apiVersion: 'v1', kind: 'Secret', metadata: { name: mirrorName(identityName) } }, mods);
}

/**
 * The Terraform Job a provider's manager writes, before the credential delivery fragment is
 * added (docs/job-contract.md): container `terraform` running `captf-runner -- terraform
 * <action>` as a non-root user, with the Job's own TF_IN_AUTOMATION, TF_INPUT and KUBE_NAMESPACE.
 */
export function terraformJob(name: string, action: 'apply' | 'destroy', ...mods: Modifier<V1Job>[]): V1Job {
  const container: V1Container = {
    name: 'terraform',
    image: 'registry.example/captf-terraform:1.0',
    command: ['captf-runner', '--', 'terraform', action, '-auto-approve', '-input=false'],
    env: [
      { name: 'TF_IN_AUTOMATION', value: '1' },
      { name: 'TF_INPUT', value: '0' },
      { name: 'KUBE_NAMESPACE', valueFrom: { fieldRef: { fieldPath: 'metadata.namespace' } } },
    ],
    securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } },
  };
  const pod: V1PodSpec = {
    restartPolicy: 'Never',
    securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532 },
    containers: [container],
  };
  return build<V1Job>(
    { apiVersion: 'batch/v1', kind: 'Job', metadata: { name }, spec: { backoffLimit: 0, template: { spec: pod } } },
    mods,
  );
}

/** The condition of `type` on an object, if any. */
export function conditionOf(
  o: { status?: { conditions?: Condition[] } | undefined },
  type: string,
): Condition | undefined {
  return o.status?.conditions?.find((c) => c.type === type);
}

/**
 * Server-side applies the `status` of a built identity or consumer (e.g. made with
 * `conditions(...)`) as field manager `manager`, forcing: another controller's write, which
 * the project's own status writes must keep. `kinds`: consumer kinds beyond the shipped two.
 */
export async function applyStatusAs(
  a: Clients,
  o: TerraformClusterIdentity | Consumer,
  manager: string,
  kinds: readonly ConsumerKind[] = [],
): Promise<void> {
  const { name, namespace } = o.metadata;
  const status = { metadata: { name, namespace }, status: o.status ?? {} };
  await objectsOf(a, o, [...DEFAULT_CONSUMER_KINDS, ...kinds]).applyStatus(status, manager);
}

// ---------------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------------

/** One row of a table test: its name, and whatever inputs and wanted outcome it holds. */
export interface Row {
  name: string;
}

/** One `it` per row, named by the row, each running `check(row)`. */
export function rows<R extends Row>(table: readonly R[], check: (row: R) => unknown): void {
  for (const row of table) it(row.name, async () => void (await check(row)));
}

// ---------------------------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------------------------

/** The objects the builders make, as the world creates them. */
type Built = TerraformClusterIdentity | Consumer | V1Secret | V1Namespace;

/** A function's (or the event source's) ServiceAccount in the rendered manifests. */
export type Account =
  'captf-admission' | 'captf-mirror-sync' | 'captf-identity-status' | 'captf-dead-letters' | 'captf-event-sources';

/** A client acting as one of the manifests' ServiceAccounts. */
export interface AccountClients {
  clients: Clients;
  kubeconfigPath: string;
  /** `system:serviceaccount:<namespace>:<name>` (the audit log's `user.username`). */
  user: string;
}

/** One test file's objects in the shared control plane; see the file comment. */
export interface World {
  /** Admin clients (system:masters). */
  readonly clients: Clients;
  /** A name unique to this run: `<prefix>-<what>-<random>`. */
  name(what: string): string;
  /** Creates a fresh namespace `<prefix>-<random>` (modifiers add labels); returns its name. */
  namespace(...mods: Modifier<V1Namespace>[]): Promise<string>;
  /** Creates a built object (consumers and Secrets in `metadata.namespace`); returns what the API server stored. */
  create<T extends Built>(o: T): Promise<T>;
  /**
   * Creates an identity or consumer, or replaces the stored one at its current resourceVersion:
   * metadata (labels, annotations, finalizers) and spec become exactly the built object's, so
   * what the builder did not set is removed (a finalizer too); the status is kept.
   */
  put<T extends TerraformClusterIdentity | Consumer>(o: T): Promise<T>;
  /** Reads a built object back by its kind, name and namespace; undefined when it is gone. */
  read<T extends Built>(o: T): Promise<T | undefined>;
  /** Deletes a built object; a missing one is fine. */
  delete(o: Built): Promise<void>;
  /**
   * Clients acting as one of the manifests' ServiceAccounts, holding exactly the RBAC the
   * rendered manifests give it (installed for this file; `rules` may narrow or extend each
   * rendered rule list first, e.g. to take a verb away for a test of a 403).
   */
  account(name: Account, rules?: (rendered: V1PolicyRule[]) => V1PolicyRule[]): Promise<AccountClients>;
  /** Runs `fn` after the file's tests, before the namespaces are deleted (last registered runs first). */
  onCleanup(fn: () => Promise<unknown>): void;
}

/** The consumer kind of a built consumer (the shipped kinds, or `kinds` for a test's own). */
function kindOf(o: Consumer, kinds: readonly ConsumerKind[]): ConsumerKind {
  const kind = findConsumerKind(kinds, o.apiVersion ?? '', o.kind ?? '');
  if (!kind) throw new Error(`no consumer kind ${o.apiVersion}/${o.kind}`);
  return kind;
}

/** Typed access to the custom objects of `o`'s kind. */
function objectsOf(a: Clients, o: TerraformClusterIdentity | Consumer, kinds: readonly ConsumerKind[]) {
  return (o.kind === IDENTITY_KIND ? identities(a) : consumerObjects(a, kindOf(o as Consumer, kinds))) as CustomObjects<
    TerraformClusterIdentity | Consumer
  >;
}

let renderedOnce: Promise<KubernetesObject[]> | undefined;
/** The manifests as shipped without CRDs, rendered once per process. */
const rendered = () => (renderedOnce ??= render('manifests/overlays/without-crds'));

/**
 * The world of one test file. Registers an `after` hook that scans every output, Event,
 * condition and status for a planted Secret value, runs the cleanups, and deletes the
 * file's namespaces, pass or fail.
 * @param prefix names this file's namespaces and objects (short, DNS-1123).
 * @param opts.kinds consumer kinds beyond the shipped two (a test's own CRD).
 */
export function world(prefix: string, opts: { kinds?: readonly ConsumerKind[] } = {}): World {
  const a = admin();
  const kinds = [...DEFAULT_CONSUMER_KINDS, ...(opts.kinds ?? [])];
  const created: string[] = [];
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    // The cleanups run even when the scan fails: a later `after` of the file would not run then.
    const scanned = (async () => [...outputLeaks(), ...(await clusterLeaks(admin(), created))])();
    await scanned.catch(() => undefined);
    for (const fn of cleanups.reverse()) await fn().catch(() => undefined);
    await Promise.all(created.map((name) => a.core.deleteNamespace({ name }).catch(() => undefined)));
    assert.deepEqual(await scanned, [], 'no planted Secret value in any output, Event, condition or status');
  });
  const w: World = {
    clients: a,
    name: (what) => `${prefix}-${what}-${suffix()}`,
    async namespace(...mods) {
      const ns = namespace(`${prefix}-${suffix()}`, ...mods);
      await a.core.createNamespace({ body: ns });
      created.push(ns.metadata!.name!);
      return ns.metadata!.name!;
    },
    async create(o) {
      if (o.kind === 'Namespace') {
        const ns = (await a.core.createNamespace({ body: o as V1Namespace })) as typeof o;
        created.push(ns.metadata!.name!);
        return ns;
      }
      const namespaced = o.metadata?.namespace;
      const made =
        o.kind === 'Secret'
          ? ((await a.core.createNamespacedSecret({ namespace: namespaced!, body: o as V1Secret })) as typeof o)
          : ((await objectsOf(a, o as Consumer, kinds).create(o as Consumer)) as typeof o);
      // Only what this call created is cleaned up (a refused create may share a name with another file's object).
      if (!namespaced || !created.includes(namespaced)) w.onCleanup(() => w.delete(o));
      return made;
    },
    async put(o) {
      const objects = objectsOf(a, o, kinds);
      try {
        // A function may write the object's status between the read and the write: read again.
        return (await retryOnConflict(async () => {
          const cur = await objects.get(o.metadata as { name: string });
          const metadata = { ...o.metadata, resourceVersion: cur.metadata.resourceVersion };
          return objects.replace({ ...cur, ...o, metadata, status: cur.status } as Consumer);
        })) as typeof o;
      } catch (err) {
        if (!isNotFound(err)) throw err;
        return w.create(o);
      }
    },
    async read(o) {
      const at = o.metadata as { name: string; namespace?: string };
      if (o.kind === 'Namespace') return (await ignoreNotFound(a.core.readNamespace(at))) as typeof o | undefined;
      if (o.kind === 'Secret')
        return (await ignoreNotFound(a.core.readNamespacedSecret({ name: at.name, namespace: at.namespace! }))) as
          typeof o | undefined;
      return (await ignoreNotFound(objectsOf(a, o as Consumer, kinds).get(at))) as typeof o | undefined;
    },
    async delete(o) {
      const at = o.metadata as { name: string; namespace?: string };
      if (o.kind === 'Namespace') await ignoreNotFound(a.core.deleteNamespace(at));
      else if (o.kind === 'Secret')
        await ignoreNotFound(a.core.deleteNamespacedSecret({ name: at.name, namespace: at.namespace! }));
      else await ignoreNotFound(objectsOf(a, o as Consumer, kinds).delete(at));
    },
    account: (name, rules) => accountClients(w, name, rules),
    onCleanup(fn) {
      cleanups.push(fn);
    },
  };
  return w;
}

/**
 * Installs the rendered manifests' RBAC of ServiceAccount `name` in a fresh namespace of the
 * world (cluster-scoped names suffixed, so files never share them), mints a token for it,
 * and waits until the API server's authorizer allows its first rule.
 */
async function accountClients(
  w: World,
  name: Account,
  rules: ((rendered: V1PolicyRule[]) => V1PolicyRule[]) | undefined,
): Promise<AccountClients> {
  const home = await w.namespace();
  const objects = accountRbac(await rendered(), name).map((o) => {
    const r = o as KubernetesObject & { rules?: V1PolicyRule[] };
    return rules && r.rules ? { ...r, rules: rules(structuredClone(r.rules)) } : r;
  });
  const rbac = await installRbac(w.clients.kc, objects, { namespace: home, suffix: suffix() });
  w.onCleanup(rbac.cleanup);
  const { path, kc } = await serviceAccountKubeConfig(w.clients.kc, {
    namespace: home,
    name,
    dir: `${controlPlaneDir()}/users`,
  });
  const user = `system:serviceaccount:${home}:${name}`;
  const first = objects.flatMap((o) => (o as { rules?: V1PolicyRule[] }).rules ?? [])[0];
  if (first) await allowed(w.clients, user, home, first);
  return { clients: makeClients(kc), kubeconfigPath: path, user };
}

/** The ServiceAccount `name` and the (Cluster)Roles and bindings whose subjects name it. */
function accountRbac(objects: readonly KubernetesObject[], name: string): KubernetesObject[] {
  type Binding = KubernetesObject & { roleRef: { kind: string; name: string }; subjects?: { name: string }[] };
  const bindings = objects.filter(
    (o): o is Binding =>
      (o.kind === 'ClusterRoleBinding' || o.kind === 'RoleBinding') &&
      ((o as Binding).subjects ?? []).some((s) => s.name === name),
  );
  const roles = objects.filter((o) =>
    bindings.some((b) => b.roleRef.kind === o.kind && b.roleRef.name === o.metadata?.name),
  );
  const account = objects.filter((o) => o.kind === 'ServiceAccount' && o.metadata?.name === name);
  if (account.length !== 1 || roles.length === 0) throw new Error(`the rendered manifests hold no RBAC for ${name}`);
  return [...account, ...roles, ...bindings];
}

/** Waits until a SubjectAccessReview allows `user` the first verb and resource of `rule`. */
async function allowed(a: Clients, user: string, namespace: string, rule: V1PolicyRule): Promise<void> {
  const [group, sub] = [rule.apiGroups?.[0] ?? '', (rule.resources?.[0] ?? '').split('/')];
  const resourceAttributes = { group, resource: sub[0], subresource: sub[1], verb: rule.verbs[0], namespace };
  await eventually(`RBAC of ${user} to take effect`, async () => {
    const r = await a.authz.createSubjectAccessReview({ body: { spec: { user, resourceAttributes } } });
    return r.status?.allowed === true;
  });
}
