/**
 * mirror-sync under test: one started in this process for a test file's world (also behind a
 * fault proxy with per-test rules), the operator's source Secret its identities name,
 * consumers made in bulk, the provider's manager calling prepare, a Knative-like delivery that retries 5xx answers, ApiServerSource events
 * about identities and consumers, and a policy that refuses Secret writes.
 * Objects are made with the builders and the world of fixtures.ts.
 */
import assert from 'node:assert/strict';
import { CloudEvent } from 'cloudevents';
import pLimit from 'p-limit';
import { AdmissionregistrationV1Api, type KubeConfig, type V1Secret } from '@kubernetes/client-node';
import {
  DEFAULT_CONSUMER_KINDS,
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  TERRAFORM_MACHINE,
  type Condition,
  type Consumer,
  type ConsumerKind,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { KEY_EVENT_TYPE } from '../../functions/lib/cloudevents.ts';
import { findConsumerKind } from '../../functions/lib/consumers.ts';
import type { FunctionHandle } from '../../functions/lib/http.ts';
import { loadKubeConfig, type Clients } from '../../functions/lib/kube.ts';
import { start } from '../../functions/mirror-sync/index.ts';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { apiServerEvent, postEvents, UNSIGNED_EVENTS, type EventAnswer, type EventTarget } from './events.ts';
import { startFaultProxy, type Answer, type FaultProxy } from './fault-proxy.ts';
import * as fx from './fixtures.ts';
import { scanLater } from './leaks.ts';
import { captureLogger, type CapturedLog } from './logs.ts';
import { manager, postPrepare, type PrepareAnswer } from './prepare.ts';
import type { PrepareCaller } from '../../scripts/lib/serviceaccount.ts';

// ---------------------------------------------------------------------------------------------
// mirror-sync in this process
// ---------------------------------------------------------------------------------------------

/** A mirror-sync running in this process for a test file. */
export interface MirrorSyncUnderTest {
  /** The running function (closed in the world's cleanup). */
  handle: FunctionHandle;
  /** Where its events go: `http://127.0.0.1:<port>/` (`${url}healthz`, `postPrepare(url, …)`). */
  url: string;
  /** Its log lines, captured (and scanned for planted Secret values after the file). */
  log: CapturedLog;
}

/**
 * Starts mirror-sync in this process on a free port of 127.0.0.1, with the world's admin
 * clients unless `opts.kubeconfig` (a KubeConfig or a kubeconfig file) says otherwise,
 * `opts.env` as its whole environment (over {@link UNSIGNED_EVENTS}), and a captured logger of its own (or `opts.log`, to
 * share one). It is closed after the file's tests, in the world's cleanup.
 * @throws what `start` throws (e.g. for a bad setting in `opts.env`); nothing is registered then.
 */
export async function mirrorSyncUnderTest(
  w: fx.World,
  opts: { env?: Record<string, string>; kubeconfig?: KubeConfig | string; log?: CapturedLog } = {},
): Promise<MirrorSyncUnderTest> {
  const log = opts.log ?? captureLogger('mirror-sync');
  const kubeconfig =
    typeof opts.kubeconfig === 'string' ? loadKubeConfig(opts.kubeconfig) : (opts.kubeconfig ?? w.clients.kc);
  const handle = await start({
    port: 0,
    host: '127.0.0.1',
    kubeconfig,
    logger: log.logger,
    env: { ...UNSIGNED_EVENTS, ...opts.env },
  });
  w.onCleanup(() => handle.close());
  return { handle, url: `http://127.0.0.1:${handle.port}/`, log };
}

/** One rule of a {@link ProxiedMirrorSync}'s proxy: `answer` the next `times` requests that `matches`. */
export interface FaultRule {
  matches: (method: string, url: string) => boolean;
  answer: Answer;
  times: number;
}

/** A mirror-sync under test whose API calls go through a fault proxy (fault-proxy.ts). */
export interface ProxiedMirrorSync extends MirrorSyncUnderTest {
  proxy: FaultProxy;
  /** Adds a rule; the first rule that matches a request and has answers left answers it. */
  fault(rule: FaultRule): void;
}

/**
 * Starts {@link mirrorSyncUnderTest} with admin's credentials through a fault proxy that
 * forwards every request except those a rule added with `fault()` answers. One instance may
 * serve a whole file: each test adds rules that match its own objects only. Both are closed
 * after the file.
 */
export async function mirrorSyncBehindProxy(
  w: fx.World,
  opts: { env?: Record<string, string>; log?: CapturedLog } = {},
): Promise<ProxiedMirrorSync> {
  const rules: FaultRule[] = [];
  const proxy = await startFaultProxy((method, url) => {
    const rule = rules.find((r) => r.times > 0 && r.matches(method, url));
    if (rule) rule.times--;
    return rule?.answer;
  });
  w.onCleanup(async () => proxy.close());
  const ms = await mirrorSyncUnderTest(w, { ...opts, kubeconfig: proxy.kubeconfigPath });
  return { ...ms, proxy, fault: (rule) => void rules.push(rule) };
}

/** Matches mirror-sync's read of identity `id`'s mirror in `namespace` (every reconcile of that key makes one). */
export const mirrorRead =
  (namespace: string, id: string) =>
  (method: string, url: string): boolean =>
    method === 'GET' && url.startsWith(`/api/v1/namespaces/${namespace}/secrets/${mirrorName(id)}`);

/** The value of `$CAPTF_CONSUMER_KINDS` configuring exactly `kinds` (group/version/Kind/plural each). */
export const consumerKindsSetting = (...kinds: ConsumerKind[]): string =>
  kinds.map((k) => `${k.group}/${k.version}/${k.kind}/${k.plural}`).join(',');

/** A test file's operator source Secret, and identities that name it. */
export interface OperatorSource {
  /** The Secret as created (`w.read(source.secret)` reads it as it is now). */
  secret: V1Secret;
  /** Its namespace (a fresh one of the world's). */
  namespace: string;
  /** Its name (`creds`). */
  name: string;
  /** The `secretRef` naming it, for building identities (`identity(name, source.ref, …)`). */
  ref: fx.Modifier<TerraformClusterIdentity>;
  /**
   * Creates an identity naming it (named `<prefix>-id-<random>`, deleted after the file), with
   * `mods`, e.g. `allowList(n)`; returns its name.
   */
  newIdentity(...mods: fx.Modifier<TerraformClusterIdentity>[]): Promise<string>;
}

/**
 * Creates `identity(<prefix>-id-<random>, ...mods)` through the world (deleted after the
 * file); returns its name.
 */
export const newIdentity = async (w: fx.World, ...mods: fx.Modifier<TerraformClusterIdentity>[]): Promise<string> =>
  (await w.create(fx.identity(w.name('id'), ...mods))).metadata.name!;

/** The condition `type` of `o` as the API server has it now (undefined when `o` is gone or has none). */
export async function readCondition(
  w: fx.World,
  o: TerraformClusterIdentity | Consumer,
  type: string,
): Promise<Condition | undefined> {
  const now = await w.read(o);
  return now && fx.conditionOf(now, type);
}

/** Creates the source Secret `creds` (`mods`: its data, …) in a fresh namespace of `w`. */
export async function operatorSource(w: fx.World, ...mods: fx.Modifier<V1Secret>[]): Promise<OperatorSource> {
  const namespace = await w.namespace();
  const name = 'creds';
  const secret = await w.create(fx.sourceSecret(name, fx.inNamespace(namespace), ...mods));
  const ref = fx.secretRef(namespace, name);
  return { secret, namespace, name, ref, newIdentity: (...more) => newIdentity(w, ref, ...more) };
}

/** Every other consumer a TerraformMachine (odd `i`), the rest TerraformClusters: for `createConsumers`. */
export const alternatingKinds = (i: number): ConsumerKind => (i % 2 ? TERRAFORM_MACHINE : TERRAFORM_CLUSTER);

/**
 * Creates `count` consumers `<prefix>-0`, `<prefix>-1`, … in `namespace` naming identity `id`
 * at once, the i-th of kind `kindOf(i)` (default TerraformCluster); returns them as stored.
 */
export const createConsumers = (
  w: fx.World,
  namespace: string,
  id: string,
  prefix: string,
  count: number,
  kindOf: (i: number) => ConsumerKind = () => TERRAFORM_CLUSTER,
): Promise<Consumer[]> =>
  Promise.all(
    Array.from({ length: count }, (_, i) =>
      w.create(fx.consumer(`${prefix}-${i}`, fx.inNamespace(namespace), fx.identityRef(id), fx.ofKind(kindOf(i)))),
    ),
  );

/** The provider's manager asking a mirror-sync under test to prepare (SPEC §5). */
export interface PrepareManager {
  /** Its ServiceAccount and audience-bound token (prepare.ts `manager`). */
  caller: PrepareCaller;
  /** `POST /prepare` with `body` (usually `prepareTarget(consumer)`), as the manager. */
  prepare(body: unknown): Promise<PrepareAnswer>;
  /** The text of every answer so far (also scanned for planted Secret values after the file). */
  answers: string[];
}

/** The provider's manager for `ms` (prepare.ts `manager`: `opts.extraRules` for a test's own kind). */
export async function prepareManager(
  w: fx.World,
  ms: MirrorSyncUnderTest,
  opts: Parameters<typeof manager>[1] = {},
): Promise<PrepareManager> {
  const caller = await manager(w, opts);
  const answers: string[] = [];
  scanLater('prepare answers', () => answers.join('\n'));
  const prepare = async (body: unknown) => {
    const r = await postPrepare(ms.url, body, caller);
    answers.push(r.text);
    return r;
  };
  return { caller, prepare, answers };
}

// ---------------------------------------------------------------------------------------------
// Events and their delivery
// ---------------------------------------------------------------------------------------------

/**
 * Delivers events to `to` like a Knative Trigger with a retry policy: re-sends on 5xx up
 * to `retries` times with a short backoff; returns the last answer (events.ts `postEvents`:
 * from a function under test, with the detail it logged).
 */
export async function deliver(
  to: string | EventTarget,
  events: CloudEvent<unknown> | CloudEvent<unknown>[],
  opts: { retries?: number; mode?: 'binary' | 'structured' | 'batch' } = {},
): Promise<EventAnswer> {
  let last = await postEvents(to, events, opts.mode);
  for (let i = 0; i < (opts.retries ?? 5) && last.status >= 500; i++) {
    await new Promise((r) => setTimeout(r, 100 * (i + 1)));
    last = await postEvents(to, events, opts.mode);
  }
  return last;
}

/**
 * Delivers each of `events` like a Trigger (retrying 5xx up to 10 times), `inFlight` at a
 * time (default: all at once), round-robin over `urls`; asserts that every answer is 200.
 */
export async function deliverAll(
  urls: string | string[],
  events: CloudEvent<unknown>[],
  inFlight = events.length,
): Promise<void> {
  const to = typeof urls === 'string' ? [urls] : urls;
  const limit = pLimit(Math.max(inFlight, 1));
  const answers = await Promise.all(events.map((e, i) => limit(() => deliver(to[i % to.length]!, e, { retries: 10 }))));
  assert.deepEqual(
    answers.filter((r) => r.status !== 200).map((r) => r.text),
    [],
  );
}

/** The consumer kind of `c` among `kinds` (TerraformCluster when `c` names none). */
function kindOf(c: Consumer, kinds: readonly ConsumerKind[]): ConsumerKind {
  const kind = c.kind ? findConsumerKind(kinds, c.apiVersion ?? '', c.kind) : TERRAFORM_CLUSTER;
  if (!kind) throw new Error(`no consumer kind ${c.apiVersion}/${c.kind}`);
  return kind;
}

/**
 * An ApiServerSource event about a consumer (of the shipped kinds, or of `kinds` for a
 * test's own); a consumer built without a namespace makes an event without one.
 */
export const consumerEvent = (
  c: Consumer,
  mode: 'resource' | 'ref' = 'ref',
  verb: 'add' | 'update' | 'delete' = 'update',
  kinds: readonly ConsumerKind[] = DEFAULT_CONSUMER_KINDS,
) => {
  const kind = kindOf(c, kinds);
  return apiServerEvent(
    { ...(c as object), apiVersion: fx.apiVersionOf(kind), kind: kind.kind, metadata: c.metadata as never },
    mode,
    verb,
    kind.plural,
  );
};

/**
 * The event a resync fans out for one key (SPEC §12): reconcile it from fresh reads. Tests
 * use it where something other than a consumer changed (a source, a mirror edited by hand),
 * as a consumer's own event whose conditions are current is only an echo.
 */
export const keyEvent = (namespace: string, identity: string): CloudEvent<unknown> =>
  new CloudEvent<unknown>({
    type: KEY_EVENT_TYPE,
    source: 'test/resync',
    subject: `${namespace}/${identity}`,
    datacontenttype: 'application/json',
    data: { namespace, identity },
  });

/** The outcomes of an answer of mirror-sync to events, as `[object, outcome]`. */
export const outcomes = (body: unknown): [string, string][] =>
  (body as { events: { results?: { object: string; outcome: string }[] }[] }).events
    .flatMap((e) => e.results ?? [])
    .map((r) => [r.object, r.outcome]);

/** An ApiServerSource event about an identity (as built, or as read back). */
export const identityEvent = (
  i: TerraformClusterIdentity,
  mode: 'resource' | 'ref' = 'ref',
  verb: 'add' | 'update' | 'delete' = 'update',
) =>
  apiServerEvent(
    {
      ...(i as object),
      apiVersion: fx.apiVersionOf(IDENTITY_RESOURCE),
      kind: IDENTITY_RESOURCE.kind,
      metadata: i.metadata as never,
    },
    mode,
    verb,
    IDENTITY_RESOURCE.plural,
  );

// ---------------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------------

/**
 * A ValidatingAdmissionPolicy (and its binding) that refuses `operations` on Secrets in the
 * namespaces labelled `<label>=true`, with a careless message that may echo the Secret's data.
 * @param policy.reason the Status reason it answers with (default Invalid: 422; Forbidden: 403).
 * @returns a function that deletes both.
 */
export async function refuseSecrets(
  a: Clients,
  policy: { label: string; operations: string[]; messageExpression: string; reason?: string },
): Promise<() => Promise<void>> {
  const vap = a.kc.makeApiClient(AdmissionregistrationV1Api);
  const name = policy.label;
  await vap.createValidatingAdmissionPolicy({
    body: {
      metadata: { name },
      spec: {
        failurePolicy: 'Fail',
        matchConstraints: {
          resourceRules: [
            { apiGroups: [''], apiVersions: ['v1'], operations: policy.operations, resources: ['secrets'] },
          ],
        },
        validations: [
          {
            expression: 'false',
            messageExpression: policy.messageExpression,
            ...(policy.reason ? { reason: policy.reason } : {}),
          },
        ],
      },
    },
  });
  await vap.createValidatingAdmissionPolicyBinding({
    body: {
      metadata: { name },
      spec: {
        policyName: name,
        validationActions: ['Deny'],
        matchResources: { namespaceSelector: { matchLabels: { [policy.label]: 'true' } } },
      },
    },
  });
  return async () => {
    await vap.deleteValidatingAdmissionPolicyBinding({ name }).catch(() => undefined);
    await vap.deleteValidatingAdmissionPolicy({ name }).catch(() => undefined);
  };
}
