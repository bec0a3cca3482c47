/**
 * The admission function (SPEC §10) for tests: behind the real API server (in-process over
 * HTTPS with a test CA, as its ServiceAccount with the rendered manifests' RBAC, registered
 * with an objectSelector on the file's own label), the RBAC of the test users who call it,
 * raw requests that show what kubectl sees, and the AdmissionReview requests unit tests
 * decide on.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig, RbacAuthorizationV1Api, type V1PolicyRule } from '@kubernetes/client-node';
import type { IdentityRequest } from '../../functions/admission/decide.ts';
import { start } from '../../functions/admission/index.ts';
import { IDENTITY_RESOURCE, type TerraformClusterIdentity } from '../../functions/lib/api.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { apiStatus, type Clients } from '../../functions/lib/kube.ts';
import { identities } from '../../functions/lib/objects.ts';
import { createWebhookPair } from '../../scripts/controlplane/pki.ts';
import { registerWebhook } from '../../scripts/system/webhook.ts';
import { asUser, eventually, suffix, webhookClientCaPath } from './cluster.ts';
import * as fx from './fixtures.ts';
import { captureLogger, sentinel } from './logs.ts';

// ---------------------------------------------------------------------------------------------
// The webhook
// ---------------------------------------------------------------------------------------------

/** The admission function of one test file, as the API server calls it. */
export interface Webhook {
  /** The running function. */
  fn: FunctionHandle;
  /** Its ServiceAccount `captf-admission` (`user` is the audit log's `user.username` of its requests). */
  account: fx.AccountClients;
  /** Its log lines, kept (and scanned for planted values after the file). */
  log: ReturnType<typeof captureLogger>;
  /** Labels an identity as the file's own: only such identities are sent to this webhook. */
  ours: fx.Modifier<TerraformClusterIdentity>;
  /** The label selector (`key=value`) of the file's own identities. */
  selector: string;
}

/**
 * Starts the admission function as `captf-admission` (the rendered manifests' RBAC) over HTTPS
 * with a fresh test CA, registers a ValidatingWebhookConfiguration for identities labelled
 * `labelKey=<random>`, and waits until the API server calls it. After the file's tests the
 * registration goes first, then every identity with the label (retried while the API server
 * still calls the webhook, which refuses deleting one in use), and the function last.
 */
export async function admissionWebhook(w: fx.World, labelKey: string): Promise<Webhook> {
  const value = suffix();
  const ours = fx.labels({ [labelKey]: value });
  const selector = `${labelKey}=${value}`;
  const account = await w.account('captf-admission');
  const log = captureLogger('admission');
  const pki = mkdtempSync(join(tmpdir(), 'captf-adm-'));
  w.onCleanup(async () => rmSync(pki, { recursive: true, force: true }));
  const { leaf, caPem } = await createWebhookPair(pki, w.name('ca'));
  const objects = identities(w.clients);
  const fn = await start({
    port: 0,
    host: '127.0.0.1',
    kubeconfig: account.clients.kc,
    logger: log.logger,
    // As an operator configures it: only the API server's webhook client certificate gets a review.
    env: {
      CAPTF_TLS_CERT_FILE: leaf.cert,
      CAPTF_TLS_KEY_FILE: leaf.key,
      CAPTF_ADMISSION_CLIENT_CA_FILE: webhookClientCaPath(),
    },
  });
  w.onCleanup(() => fn.close());
  w.onCleanup(() =>
    eventually("the file's identities to be deleted", async () => {
      const left = (await objects.list({ labelSelector: selector })).items ?? [];
      for (const o of left) await objects.delete({ name: o.metadata.name! }).catch(() => undefined);
      return left.length === 0;
    }),
  );
  const url = `https://127.0.0.1:${fn.port}`;
  const matchLabels = { [labelKey]: value };
  w.onCleanup(await registerWebhook(w.clients.kc, { url, caBundlePem: caPem, name: w.name('webhook'), matchLabels }));
  // Active once it refuses what only it refuses: an unknown selector operator passes the CRD schema.
  await eventually('the webhook to be active', async () => {
    const probe = fx.identity(
      w.name('probe'),
      ours,
      fx.allowSelector({ matchExpressions: [{ key: 'k', operator: 'Near' }] }),
    );
    try {
      await objects.create(probe);
      await objects.delete({ name: probe.metadata.name! }).catch(() => undefined);
      return false;
    } catch (e) {
      return /denied the request/.test(String((e as { body?: unknown }).body));
    }
  });
  return { fn, account, log, ours, selector };
}

/** The stored identity `name`, read as admin; fails the test when there is none. */
export async function storedIdentity(w: fx.World, name: string): Promise<TerraformClusterIdentity> {
  const o = await w.read(fx.identity(name));
  if (!o) throw new Error(`identity ${name} is not stored`);
  return o;
}

// ---------------------------------------------------------------------------------------------
// Test users' RBAC
// ---------------------------------------------------------------------------------------------

/** Whom a test grants RBAC to: a minted user, or a group of them. */
export interface Subject {
  kind: 'User' | 'Group';
  name: string;
}

/**
 * Grants `subject` the `rules`: in `namespace` (a Role and its RoleBinding), or cluster-wide
 * (a ClusterRole and its ClusterRoleBinding, deleted after the file). Waits until the API
 * server's authorizer allows the subject the first verb of the first rule.
 */
export async function grant(w: fx.World, subject: Subject, rules: V1PolicyRule[], namespace?: string): Promise<void> {
  const rbac = w.clients.kc.makeApiClient(RbacAuthorizationV1Api);
  const name = w.name('grant');
  const binding = {
    metadata: { name },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: namespace ? 'Role' : 'ClusterRole', name },
    subjects: [{ ...subject, apiGroup: 'rbac.authorization.k8s.io' }],
  };
  if (namespace) {
    await rbac.createNamespacedRole({ namespace, body: { metadata: { name }, rules } });
    await rbac.createNamespacedRoleBinding({ namespace, body: binding });
  } else {
    await rbac.createClusterRole({ body: { metadata: { name }, rules } });
    w.onCleanup(() => rbac.deleteClusterRole({ name }));
    await rbac.createClusterRoleBinding({ body: binding });
    w.onCleanup(() => rbac.deleteClusterRoleBinding({ name }));
  }
  const rule = rules[0]!;
  const [resource, subresource] = (rule.resources?.[0] ?? '').split('/');
  const who = subject.kind === 'User' ? { user: subject.name } : { user: w.name('member'), groups: [subject.name] };
  const resourceAttributes = {
    group: rule.apiGroups?.[0] ?? '',
    resource,
    subresource,
    verb: rule.verbs[0],
    name: rule.resourceNames?.[0],
    namespace,
  };
  await eventually(`RBAC of ${subject.kind} ${subject.name} to take effect`, async () => {
    const r = await w.clients.authz.createSubjectAccessReview({ body: { spec: { ...who, resourceAttributes } } });
    return r.status?.allowed === true;
  });
}

// ---------------------------------------------------------------------------------------------
// Raw requests
// ---------------------------------------------------------------------------------------------

/** The API path of the identities, or of identity `name`, with `tail` (a subresource, a query). */
export function identityPath(name?: string, tail = ''): string {
  const { group, version, plural } = IDENTITY_RESOURCE;
  return `/apis/${group}/${version}/${plural}${name ? `/${name}` : ''}${tail}`;
}

/** An answer of the API server to {@link request}. */
export interface ApiAnswer {
  status: number;
  /** The body, parsed (`{ text }` when it is not JSON). */
  body: Record<string, unknown>;
  /** The Status message, else the start of the body. */
  message: string;
  /** The text of each `Warning` response header (client-node does not expose them). */
  warnings: string[];
}

/** The text of one `Warning` header (`299 - "text"`, RFC 7234 as the API server writes it). */
function warningText(header: string): string {
  const m = /^\d{3} \S+ "((?:[^"\\]|\\.)*)"/.exec(header);
  return m ? (JSON.parse(`"${m[1]}"`) as string) : header;
}

/**
 * A raw request as the kubeconfig's user, the way kubectl makes it (any method, content
 * type and header; a string body is sent as is, anything else as JSON).
 */
export async function request(
  kubeconfigPath: string,
  method: string,
  path: string,
  opts: { body?: unknown; contentType?: string; headers?: Record<string, string> } = {},
): Promise<ApiAnswer> {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const url = new URL(path, kc.getCurrentCluster()!.server);
  const req: RequestOptions = {
    method,
    hostname: url.hostname,
    port: url.port,
    path: url.pathname + url.search,
    headers: { 'content-type': opts.contentType ?? 'application/json', accept: 'application/json', ...opts.headers },
  };
  await kc.applyToHTTPSOptions(req);
  return new Promise((resolve, reject) => {
    const r = httpsRequest(req, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let body: Record<string, unknown>;
        try {
          body = JSON.parse(text) as Record<string, unknown>;
        } catch {
          body = { text };
        }
        const warnings: string[] = [];
        for (let i = 0; i + 1 < res.rawHeaders.length; i += 2)
          if (res.rawHeaders[i]!.toLowerCase() === 'warning') warnings.push(warningText(res.rawHeaders[i + 1]!));
        const message = typeof body.message === 'string' ? body.message : text.slice(0, 500);
        resolve({ status: res.statusCode ?? 0, body, message, warnings });
      });
    });
    r.on('error', reject);
    r.end(opts.body === undefined ? undefined : typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body));
  });
}

// ---------------------------------------------------------------------------------------------
// AdmissionReviews
// ---------------------------------------------------------------------------------------------

/** An AdmissionReview (admission.k8s.io/v1) carrying `request`. */
export function admissionReview(request: unknown): { apiVersion: string; kind: string; request: unknown } {
  return { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request };
}

/**
 * The request of an AdmissionReview about identity `aws`, by user `alice` of group `tenants`:
 * `object` and `oldObject` as given (left out when undefined), and `extra` over all of it.
 */
export function identityRequest(
  operation: string,
  object?: unknown,
  oldObject?: unknown,
  extra: Partial<IdentityRequest> = {},
): IdentityRequest {
  return {
    uid: 'u-1',
    operation,
    name: 'aws',
    userInfo: { username: 'alice', groups: ['tenants'] },
    ...(object === undefined ? {} : { object }),
    ...(oldObject === undefined ? {} : { oldObject }),
    ...extra,
  };
}

/**
 * Resolves to the API error's status and message (the Status `message`, else the raw body) when
 * `p` rejects; fails the test if it resolves.
 */
export async function refusal(p: Promise<unknown>): Promise<{ code: number | undefined; message: string }> {
  try {
    await p;
  } catch (err) {
    const body = (err as { body?: unknown }).body;
    let message = typeof body === 'string' ? body : JSON.stringify(body ?? String(err));
    try {
      message = (JSON.parse(message) as { message?: string }).message ?? message;
    } catch {
      /* keep raw */
    }
    return { code: apiStatus(err), message };
  }
  assert.fail('expected the API server to refuse the request');
}

// ---------------------------------------------------------------------------------------------
// An identity's life through a deployed webhook
// ---------------------------------------------------------------------------------------------

/** What {@link identityThroughWebhook} saw. */
export interface WebhookWalk {
  /** Every refusal message a user saw (to scan for planted Secret values). */
  messages: string[];
  /** The Secret value planted in the identity's source Secret. */
  planted: string;
  /** How long the first review took (the API server's answer to the first create), in ms. */
  firstReviewMs: number;
}

/** What {@link webhookUsers} made. */
export interface WebhookUsers {
  /** Where the source Secret `creds` (holding `planted`) is; two more namespaces for allow lists. */
  secretsNs: string;
  consumerNs: string;
  otherNs: string;
  planted: string;
  /** A user who may edit identities and get `creds`, and one who may edit identities only. */
  reader: Clients;
  nobody: Clients;
  /** How the webhook's refusal of `nobody` begins. */
  mayNot: RegExp;
}

/**
 * Two minted users in a group that may edit identities: `reader-…` may also get the source
 * Secret `creds` (holding a planted value) in a fresh namespace, `nobody-…` may not; and two
 * more fresh namespaces. The webhook must allow the first's identities naming `creds` and
 * refuse the second's (SPEC §10).
 */
export async function webhookUsers(w: fx.World): Promise<WebhookUsers> {
  const [secretsNs, consumerNs, otherNs] = await Promise.all([w.namespace(), w.namespace(), w.namespace()]);
  const planted = sentinel();
  await w.create(fx.sourceSecret('creds', fx.inNamespace(secretsNs), fx.data({ token: planted })));
  const sfx = suffix();
  const editors = w.name('editors');
  const { group, plural } = IDENTITY_RESOURCE;
  await Promise.all([
    grant(w, { kind: 'Group', name: editors }, [
      { apiGroups: [group], resources: [plural], verbs: ['get', 'list', 'create', 'update', 'patch', 'delete'] },
    ]),
    grant(
      w,
      { kind: 'User', name: `reader-${sfx}` },
      [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }],
      secretsNs,
    ),
  ]);
  const [reader, nobody] = await Promise.all([asUser(`reader-${sfx}`, [editors]), asUser(`nobody-${sfx}`, [editors])]);
  const mayNot = new RegExp(`denied the request: user "nobody-${sfx}" may not`);
  return { secretsNs, consumerNs, otherNs, planted, reader, nobody, mayNot };
}

/**
 * An identity's life through the webhook the cluster has registered, whichever way the API
 * server reaches it (SPEC §10): its create and a widening update refused for a user who may not
 * get the source Secret and allowed for one who may (each refusal in the webhook's words, so
 * the webhook, not RBAC, decided), and its delete refused while a consumer uses it, allowed
 * once that is gone. A webhook that is not called fails the refusals; one that cannot be
 * reached fails the allowed steps.
 */
export async function identityThroughWebhook(w: fx.World): Promise<WebhookWalk> {
  const { secretsNs, consumerNs, otherNs, planted, reader, nobody, mayNot } = await webhookUsers(w);
  const messages: string[] = [];
  const refused = async (p: Promise<unknown>, want: RegExp) => {
    const r = await refusal(p);
    messages.push(r.message);
    assert.match(r.message, want);
  };
  const name = w.name('via');
  const o = fx.identity(name, fx.secretRef(secretsNs, 'creds'), fx.allowList(consumerNs));
  const t0 = Date.now();
  await refused(identities(nobody).create(o), mayNot);
  const firstReviewMs = Date.now() - t0;
  await identities(reader).create(o);
  w.onCleanup(() =>
    identities(w.clients)
      .delete({ name })
      .catch(() => undefined),
  );

  const widen = async (c: typeof reader) => {
    // identity-status may write the identity's status between the read and the write: that
    // conflict (409) is the API server's precondition, not a decision, so it is read again.
    for (let attempt = 1; ; attempt++) {
      const stored = await identities(c).get({ name });
      stored.spec.allowedNamespaces = { list: [consumerNs, otherNs] };
      try {
        return await identities(c).replace(stored);
      } catch (err) {
        if (attempt >= 5 || apiStatus(err) !== 409) throw err;
      }
    }
  };
  await refused(widen(nobody), mayNot);
  await widen(reader);

  const user = await w.create(fx.consumer('user', fx.inNamespace(consumerNs), fx.identityRef(name)));
  await refused(identities(reader).delete({ name }), new RegExp(`it is in use in 1 namespace: ${consumerNs}`));
  await w.delete(user);
  await eventually(
    `identity ${name} deleted once unused`,
    () =>
      identities(reader)
        .delete({ name })
        .then(() => true),
    30_000,
  );
  return { messages, planted, firstReviewMs };
}
