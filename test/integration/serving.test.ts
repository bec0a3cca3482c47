/**
 * The manifests as they ship, on Knative Serving on a real node (`startSystem({ serving: true,
 * events: 'knative' })`, scripts/serving/ and scripts/system/serving.ts): the Knative Services
 * from the product image, events through Knative Eventing's own installation on the node (the
 * ApiServerSource adapter pod, the shipped Broker and Triggers) to their cluster-local addresses, Traefik as the KIngress, the activator
 * and autoscaler deciding the scale. Each test waits for what it starts from (a function at
 * zero) instead of assuming it. One Serving start for the file, with its own control plane
 * inside the node; needs root.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CoreV1Api, CustomObjectsApi, PatchStrategy, setHeaderOptions, type V1Pod } from '@kubernetes/client-node';
import type { Consumer } from '../../functions/lib/api.ts';
import { setGlobalDispatcher } from 'undici';
import { mirrorName } from '../../functions/lib/mirror.ts';
import { podView, SERVICE_LABEL } from '../../scripts/local/scale.ts';
import type { StoredSpan } from '../../scripts/observability/jaeger.ts';
import { withRevisionAnnotations } from '../../scripts/serving/revision.ts';
import { failedDeliveries } from '../../scripts/system/broker.ts';
import { clusterLocalDispatcher } from '../../scripts/system/serving.ts';
import { identityThroughWebhook } from '../helpers/admission.ts';
import { assertNoSecret } from '../helpers/logs.ts';
import { eventually, suffix } from '../helpers/cluster.ts';
import * as fx from '../helpers/fixtures.ts';
import { createConsumers, keyEvent, operatorSource } from '../helpers/mirror-sync.ts';
import { nodeWorld, podLog } from '../helpers/node.ts';
import { eventPolicies, eventPolicy, pingEvent, postEvents } from '../helpers/events.ts';
import { eventAuthFromEnv, isSender, oidcServiceAccountName, refusal } from '../../functions/lib/senders.ts';
import { serviceAccountToken } from '../../scripts/lib/serviceaccount.ts';
import { knativeContainer, type FunctionName } from '../../scripts/system/functions.ts';
import { manager, postPrepare, prepareTarget } from '../helpers/prepare.ts';

// The longest schedules a PingSource takes: no scheduled ping may wake a function the tests wait to be at zero.
const DAY_MS = 24 * 3600_000;
// This file's world lives in the node's control plane, not in the suite's shared one.
const { system, w, work, explained, mirrorOwnedBy } = await nodeWorld('serving', {
  serving: true,
  events: 'knative',
  pings: { statusEveryMs: DAY_MS, resyncEveryMs: DAY_MS },
  // Prometheus and Jaeger inside the node: the pods push as a cluster's would.
  observability: true,
});
const serving = system.serving!;
// This process's fetch reaches `*.svc.cluster.local` through Traefik, as a pod would.
setGlobalDispatcher(clusterLocalDispatcher(serving.gateway, serving.caPem));

const NAMESPACE = 'captf-system';
const core = system.kc.makeApiClient(CoreV1Api);
const custom = system.kc.makeApiClient(CustomObjectsApi);
/** The Knative Services of the manifests whose shipped `min-scale` is 0. */
const SCALE_TO_ZERO = system.rendered
  .filter((o) => o.kind === 'Service' && o.apiVersion?.startsWith('serving.knative.dev/'))
  .filter(
    (o) =>
      (o as { spec?: { template?: { metadata?: { annotations?: Record<string, string> } } } }).spec?.template?.metadata
        ?.annotations?.['autoscaling.knative.dev/min-scale'] === '0',
  )
  .map((o) => o.metadata!.name!);
const url = (service: string) => serving.urls[service]!;

/** Every pod of a Knative Service, Running or Terminating. */
const podsOf = async (service: string): Promise<V1Pod[]> => podsLabelled(`${SERVICE_LABEL}=${service}`);

/** Every pod of the manifests' namespace with these labels (a label selector), Running or Terminating. */
const podsLabelled = async (labelSelector: string): Promise<V1Pod[]> =>
  (await core.listNamespacedPod({ namespace: NAMESPACE, labelSelector })).items;

/** The label selector of the pods of the manifests' ApiServerSource adapter (Knative's resources/labels.go). */
const ADAPTER_PODS = 'eventing.knative.dev/sourceName=captf-objects';

/** Waits until a Knative Service has no pod at all (the autoscaler's test windows are 6 s; generous). */
const atZero = (service: string) =>
  eventually(
    `${service} to have no pod (Running or Terminating)`,
    async () => (await podsOf(service)).length === 0,
    180_000,
    500,
  );

/**
 * Samples the pods of `groups` (a name → a label selector) every 250 ms until `stop()`: the
 * most of each that existed and were not Terminating at once (the autoscaler's decision;
 * whether they got Ready before the burst was over depends on the machine's load), and every
 * pod name seen, as `<group>/<pod>`.
 */
function samplePods(groups: Readonly<Record<string, string>>) {
  const most = Object.fromEntries(Object.keys(groups).map((s) => [s, 0]));
  const seen = new Set<string>();
  let running = true;
  const done = (async () => {
    while (running) {
      for (const [s, selector] of Object.entries(groups)) {
        const pods = (await podsLabelled(selector).catch(() => [])).map(podView);
        most[s] = Math.max(most[s]!, pods.filter((p) => !p.terminating).length);
        for (const p of pods) seen.add(`${s}/${p.name}`);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  })();
  return {
    most,
    seen,
    stop: async () => {
      running = false;
      await done;
    },
  };
}

/** How function `fn` (`captf-…`) checks its senders as shipped. */
const config = (fn: string) => {
  const env = knativeContainer(system.rendered, fn.replace(/^captf-/, '') as FunctionName)?.env ?? [];
  const c = eventAuthFromEnv(Object.fromEntries(env.map((e) => [e.name, e.value ?? ''])));
  assert.equal(c.mode, 'oidc', `${fn} checks its senders`);
  return c as Extract<typeof c, { mode: 'oidc' }>;
};

describe('the manifests on Knative Serving', () => {
  it('runs every Knative Service of the manifests, Ready, from the product image', async () => {
    assert.deepEqual(Object.keys(serving.urls).sort(), [
      'captf-admission',
      'captf-dead-letters',
      'captf-identity-status',
      'captf-mirror-sync',
    ]);
    // Cluster-local TLS is on: every address is https, and the Triggers deliver to those.
    for (const [name, address] of Object.entries(serving.urls))
      assert.equal(address, `https://${name}.${NAMESPACE}.svc.cluster.local`);
    // A Trigger resolved while its Service's address was still http keeps it (knative/eventing#5374)
    // until the start nudged it (scripts/system/serving.ts): the end state is what counts.
    let now = '';
    await eventually(
      'every Trigger to deliver to its function over https',
      async () => {
        const triggers = (await custom.listNamespacedCustomObject({
          group: 'eventing.knative.dev',
          version: 'v1',
          namespace: NAMESPACE,
          plural: 'triggers',
        })) as { items: { metadata: { name: string }; status?: { subscriberUri?: string } }[] };
        now = triggers.items.map((t) => `${t.metadata.name} → ${t.status?.subscriberUri}`).join('\n');
        const subscribers = [...new Set(triggers.items.map((t) => t.status?.subscriberUri))].sort();
        return JSON.stringify(subscribers) === JSON.stringify([url('captf-identity-status'), url('captf-mirror-sync')]);
      },
      60_000,
    ).catch((err: Error) => assert.fail(`${err.message}:\n${now}`));
    assert.ok(SCALE_TO_ZERO.includes('captf-mirror-sync'), 'mirror-sync ships with min-scale 0');
  });

  it('a new consumer gets its mirror from zero: adapter → Broker → Trigger → Knative Service', async () => {
    // The namespace and identity are events too: made first, then mirror-sync is left to reach zero.
    const source = await operatorSource(w, fx.data({ AWS_ACCESS_KEY_ID: 'AKIA-serving' }));
    const ns = await w.namespace();
    const id = await source.newIdentity(fx.allowList(ns));
    await atZero('captf-mirror-sync');
    const createdAt = Date.now();
    const consumer = await w.create(fx.consumer('c', fx.inNamespace(ns), fx.identityRef(id)));
    const mirror = await mirrorOwnedBy(ns, id, consumer, 120_000);
    assert.equal(Buffer.from(mirror.data!.AWS_ACCESS_KEY_ID!, 'base64').toString(), 'AKIA-serving');
    const started = (await podsOf('captf-mirror-sync')).map((p) => new Date(p.metadata!.creationTimestamp!).getTime());
    assert.ok(
      // Timestamps have whole seconds.
      started.some((t) => t >= createdAt - 1000),
      'a mirror-sync pod was started for the event (the Service was at zero before)',
    );
  });

  it("the pods push to Prometheus and Jaeger inside the node: mirror-sync's counts, Knative's own, and a consumer's trace from Knative's spans down to mirror-sync's mirror write", () =>
    telemetryOnTheNode());

  it("after idle, each function at min-scale 0 has no pod, and a prepare (over https), a ping, the API server's reviews (through Knative) or a dead letter cold-starts it", async () => {
    // Set up while functions may still run; then every Service is left to reach zero. Two
    // identities: one whose source goes (for the ping), one that stays (for the prepare).
    const source = await operatorSource(w);
    const gone = await operatorSource(w);
    const ns = await w.namespace();
    const id = await source.newIdentity(fx.allowList(ns));
    const pinged = await gone.newIdentity(fx.allowList(ns));
    const consumer = await w.create(fx.consumer('p', fx.inNamespace(ns), fx.identityRef(id)));
    const caller = await manager(w);
    for (const name of [id, pinged])
      await eventually(`identity ${name} to be Ready`, async () => {
        const stored = await w.read(fx.identity(name));
        return fx.conditionOf(stored!, 'Ready')?.status === 'True';
      });
    for (const s of SCALE_TO_ZERO) await atZero(s);

    // identity-status: a ping. A source removed while every function is at zero (no Trigger
    // routes a Secret's change), its identity turns not Ready only if a pod cold-started for
    // the ping and ran.
    await w.clients.core.deleteNamespacedSecret({ namespace: gone.namespace, name: gone.name });
    await system.broker!.ping('status');
    await explained(
      eventually(
        'identity-status to report the missing source after the ping',
        async () => fx.conditionOf((await w.read(fx.identity(pinged)))!, 'Ready')?.status === 'False',
        120_000,
        500,
      ),
    );

    // mirror-sync (woken meanwhile by the identity's status change, so left to reach zero again):
    // the provider's prepare before a Job, answered within SPEC §5's 30 s.
    await atZero('captf-mirror-sync');
    const t0 = Date.now();
    const prepared = await postPrepare(url('captf-mirror-sync'), prepareTarget(consumer), caller);
    const tookMs = Date.now() - t0;
    assert.equal(prepared.status, 200, prepared.text);
    assert.equal(prepared.body.mirror, mirrorName(id));
    assert.ok(tookMs < 30_000, `prepare from zero answered in ${tookMs} ms`);

    // Nothing calls admission or the dead-letter sink but this test: still at zero.
    for (const s of ['captf-admission', 'captf-dead-letters'])
      assert.deepEqual(
        (await podsOf(s)).map((p) => p.metadata!.name),
        [],
        `${s} is still at zero`,
      );
    // admission: the API server's review of identity changes through Knative (the rendered
    // webhook configuration: service captf-admission:443 → ExternalName → Traefik, TLS by SNI
    // with the CA cainjector put in caBundle → activator), the first from zero, within the
    // webhook's timeoutSeconds (30 s: a slower answer is a refusal the walk would not accept).
    const walk = await identityThroughWebhook(w);
    assert.ok(walk.firstReviewMs < 30_000, `the first review from zero took ${walk.firstReviewMs} ms`);
    assertNoSecret(walk.messages.join('\n'), [walk.planted], 'what the users saw');

    // dead-letters: a dead letter as the Broker's filter sends one, signed as a Trigger; unsigned, refused.
    const letterId = `dead-${suffix()}`;
    const letter = {
      'content-type': 'application/json',
      'ce-specversion': '1.0',
      'ce-id': letterId,
      'ce-source': 'captf/serving-test',
      'ce-type': 'io.captf.test.dead-letter',
      'ce-knativeerrorcode': '500',
    };
    const post = (headers: Record<string, string>) =>
      fetch(url('captf-dead-letters'), { method: 'POST', headers, body: '{}' });
    assert.equal((await post(letter)).status, 401, 'an unsigned dead letter is refused');
    const dead = await post({ ...letter, authorization: await system.sign('dead-letters') });
    assert.equal(dead.status, 202, 'a signed dead letter is taken');
    const sinks = await podsOf('captf-dead-letters');
    assert.ok(sinks.length > 0, 'the sink that answered has a pod');
    await eventually('the dead letter in its pod log', async () =>
      sinks.some((p) => podLog(work, p).includes(letterId)),
    );
  });

  it('a burst of consumers on several mirror-sync pods ends with one owner reference each, every consumer mirrored, no dead letter', async () => {
    const N = 200;
    await atZero('captf-dead-letters');
    const source = await operatorSource(w);
    const ns = await w.namespace();
    const id = await source.newIdentity(fx.allowList(ns));
    // As shipped one pod takes the whole burst; a low target makes Knative spread it over pods
    // that all add owners to the one mirror at once. Four are enough writers: the shipped ten,
    // each a cold start, made the burst outlast its bound while other test files ran beside it.
    const spread = { 'autoscaling.knative.dev/target': '15', 'autoscaling.knative.dev/max-scale': '4' };
    const mirrorSync = { namespace: NAMESPACE, service: 'captf-mirror-sync', timeoutMs: 300_000 };
    const sample = await withRevisionAnnotations(system.kc, mirrorSync, spread, async () => {
      const sample = samplePods({
        'captf-mirror-sync': `${SERVICE_LABEL}=captf-mirror-sync`,
        'captf-dead-letters': `${SERVICE_LABEL}=captf-dead-letters`,
        // A new adapter pod misses what was made while it started (README, "How soon…").
        adapter: ADAPTER_PODS,
      });
      // Read afresh at each access (the kubelet's log of broker-filter's pods).
      const filterFrom = system.broker!.logs.filter.length;
      let owners: string[] = [];
      // What a timeout reports: how far the mirror got and what the data plane gave up on.
      const state = () => {
        const failed = failedDeliveries(system.broker!.logs.filter.slice(filterFrom));
        return (
          `${owners.length} owners; pods seen ${JSON.stringify(sample.most)}, ${[...sample.seen].join(' ')}; ` +
          `broker-filter failed deliveries ${failed.count}: ${JSON.stringify(failed.kinds)}`
        );
      };
      try {
        const consumers = await createConsumers(w, ns, id, 'burst', N);
        const want = consumers.map((c) => c.metadata.uid).sort();
        await explained(
          eventually(
            `mirror ${ns}/${mirrorName(id)} to have ${N} owner references`,
            async () => {
              const s = await core.readNamespacedSecret({ namespace: ns, name: mirrorName(id) }).catch(() => undefined);
              owners = (s?.metadata?.ownerReferences ?? []).map((o) => o.uid).sort();
              return owners.length === N;
            },
            300_000,
            1000,
          ).catch((err: Error) => assert.fail(`${err.message}: ${state()}`)),
        );
        assert.deepEqual(owners, want);
        // And every consumer says so: the conditions come after the mirror (the window the
        // autoscaler sees lasts until the last one).
        await eventually(
          `the ${N} consumers in ${ns} to be CredentialsMirrored`,
          async () => {
            const list = (await custom.listNamespacedCustomObject({
              group: 'infrastructure.cluster.x-k8s.io',
              version: 'v1beta2',
              namespace: ns,
              plural: 'terraformclusters',
            })) as { items: Consumer[] };
            return (
              list.items.length === N &&
              list.items.every((c) => fx.conditionOf(c, 'CredentialsMirrored')?.status === 'True')
            );
          },
          300_000,
          1000,
        );
      } finally {
        await sample.stop();
      }
      return sample;
    });
    assert.ok(
      sample.most['captf-mirror-sync']! > 1,
      `mirror-sync scaled past one pod (most not Terminating at once: ${sample.most['captf-mirror-sync']})`,
    );
    const deadLetters = [...sample.seen].filter((p) => p.startsWith('captf-dead-letters/'));
    const logs = await Promise.all((await podsOf('captf-dead-letters')).map((p) => podLog(work, p)));
    assert.deepEqual(deadLetters, [], `no dead letter: ${logs.join('\n').slice(0, 2000)}`);
  });
});

describe('sender identity on Knative (SPEC §12)', () => {
  it("only the functions' own Triggers may send: Knative made exactly the accounts they list, and a forged delivery is refused", async () => {
    const triggers = (await custom.listNamespacedCustomObject({
      group: 'eventing.knative.dev',
      version: 'v1',
      namespace: NAMESPACE,
      plural: 'triggers',
    })) as {
      items: {
        metadata: { name: string };
        spec: { subscriber: { ref: { name: string } } };
        status?: { auth?: { serviceAccountName?: string } };
      }[];
    };
    for (const t of triggers.items) {
      const account = t.status?.auth?.serviceAccountName;
      assert.equal(account, oidcServiceAccountName(t.metadata.name), `${t.metadata.name}: the account Knative made`);
      const subject = `system:serviceaccount:${NAMESPACE}:${account}`;
      assert.ok(isSender(subject, config(t.spec.subscriber.ref.name).senders), `${subject} may send`);
    }
    // From this host through the cluster's gateway, as any pod could reach the function.
    const token = async (trigger: string, audience: string) =>
      `Bearer ${await serviceAccountToken(system.kc, { namespace: NAMESPACE, name: oidcServiceAccountName(trigger), audience })}`;
    const mirrorSync = config('captf-mirror-sync');
    const identityStatus = config('captf-identity-status');
    const forged: [string, string | undefined, number][] = [
      ['no token', undefined, 401],
      [
        "a mirror-sync Trigger's token for identity-status's audience",
        await token('captf-mirror-sync-resync', identityStatus.audience),
        401,
      ],
      [
        "an identity-status Trigger's token for mirror-sync's audience",
        await token('captf-identity-status-refresh', mirrorSync.audience),
        403,
      ],
    ];
    for (const [what, authorization, status] of forged) {
      const r = await postEvents(url('captf-mirror-sync'), pingEvent('resync'), 'binary', undefined, authorization);
      assert.equal(r.status, status, `${what}: ${r.text}`);
      assert.deepEqual(r.body, refusal(status === 401 ? 'no-token' : 'not-a-sender').body, what);
    }
  });

  it('Knative resolves the shipped EventPolicies; one that names another account lets it in, and narrowing it cuts it off', async () => {
    const policies = eventPolicies(NAMESPACE);
    type Policy = { status?: { from?: string[]; conditions?: { type: string; status: string }[] } };
    const readPolicy = async (name: string) =>
      (await custom.getNamespacedCustomObject({ ...policies, name })) as Policy;
    const isReady = (p: Policy) =>
      p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
    // The shipped function policies resolve to exactly the accounts each function lists.
    for (const fn of ['captf-mirror-sync', 'captf-identity-status']) {
      const c = config(fn);
      await eventually(`EventPolicy ${fn} to be Ready with its Triggers' accounts`, async () => {
        const p = await readPolicy(fn);
        return (
          isReady(p) && JSON.stringify([...(p.status?.from ?? [])].sort()) === JSON.stringify([...c.senders].sort())
        );
      });
    }
    await eventually('EventPolicy captf-broker to be Ready', async () => isReady(await readPolicy('captf-broker')));

    // Another account of the namespace, let in by a policy of its own.
    const account = `captf-test-sender-${suffix()}`;
    const subject = `system:serviceaccount:${NAMESPACE}:${account}`;
    await core.createNamespacedServiceAccount({ namespace: NAMESPACE, body: { metadata: { name: account } } });
    const name = `captf-test-${suffix()}`;
    try {
      const { audience } = config('captf-mirror-sync');
      const bearer = `Bearer ${await serviceAccountToken(system.kc, { namespace: NAMESPACE, name: account, audience })}`;
      // A key event for a key that does not exist: the cheapest thing mirror-sync can be asked.
      const status = async () =>
        (await postEvents(url('captf-mirror-sync'), keyEvent('captf-none', 'none'), 'binary', undefined, bearer))
          .status;
      assert.equal(await status(), 403, 'an account no policy names is refused');
      await custom.createNamespacedCustomObject({
        ...policies,
        body: eventPolicy(name, 'captf-mirror-sync', [subject]),
      });
      await eventually(
        'the policy Knative resolved to let the account in',
        async () => (await status()) === 200,
        60_000,
      );
      await custom.patchNamespacedCustomObject(
        { ...policies, name, body: { spec: eventPolicy(name, 'captf-mirror-sync', [`${subject}-not`]).spec } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      await eventually('the narrowed policy to cut the account off', async () => (await status()) === 403, 60_000);
    } finally {
      await custom.deleteNamespacedCustomObject({ ...policies, name }).catch(() => undefined);
      await core.deleteNamespacedServiceAccount({ namespace: NAMESPACE, name: account }).catch(() => undefined);
    }
  });

  it("bound to the Broker by a SinkBinding, a resync fans out its keys signed with the token Eventing mounts: refused until the Broker's policy names the binding, then a mirror lost without an event comes back", () =>
    sinkBindingFanOut());

  it('an event its function refuses is dead-lettered by Knative, signed as the Trigger that gave up: dead-letters takes it and names it', async () => {
    const id = `refused-${suffix()}`;
    // An ApiServerSource-shaped event about an object mirror-sync does not handle: a 4xx, which
    // Knative dead-letters at once.
    const sent = await system.broker!.send({
      headers: {
        'content-type': 'application/json',
        'ce-specversion': '1.0',
        'ce-id': id,
        'ce-source': 'captf/serving-test',
        'ce-type': 'dev.knative.apiserver.ref.add',
      },
      body: JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', namespace: 'default', name: 'not-a-consumer' }),
    });
    assert.equal(sent, 202, 'the Broker took it');
    const logged = async () => (await podsOf('captf-dead-letters')).flatMap((p) => podLog(work, p).split('\n'));
    const line = await eventually(
      'the dead letter in the dead-letters log',
      async () => (await logged()).find((l) => l.includes(id)),
      120_000,
    );
    const letter = JSON.parse(line.slice(line.indexOf('{'))) as Record<string, string>;
    assert.equal(letter.message, 'dead letter', line);
    assert.equal(letter.for, 'mirror-sync', line);
    assert.match(letter.code!, /^4/, line);
    assert.deepEqual(
      (await logged()).filter((l) => l.includes('event refused')),
      [],
      "Knative's filter signed it as a Trigger the function lists",
    );
  });
});

/** The mirror-sync Knative Service as this test reads it. */
interface MirrorSyncService {
  metadata: { generation: number };
  spec: { template: { spec: { containers: { env?: { name: string }[] }[] } } };
  status?: {
    observedGeneration?: number;
    latestReadyRevisionName?: string;
    latestCreatedRevisionName?: string;
    conditions?: { type: string; status: string }[];
  };
}

/** The log lines of every mirror-sync pod now on the node. */
const mirrorSyncLogs = async (): Promise<string[]> =>
  (await podsOf('captf-mirror-sync')).flatMap((p) => podLog(work, p).split('\n'));

/**
 * docs/deploy-knative.md's SinkBinding on the shipped manifests: Eventing binds `K_SINK` and
 * mounts a token for the Broker's audience into mirror-sync's new revision; a resync ping then
 * sends one key event per mirror to the Broker. The shipped `captf-broker` policy refuses them
 * (403) until it names the binding; then they come back through the key Trigger, and a mirror
 * deleted behind mirror-sync's back (no event tells it) is made again.
 */
async function sinkBindingFanOut(): Promise<void> {
  const source = await operatorSource(w, fx.data({ AWS_ACCESS_KEY_ID: 'AKIA-fanout' }));
  const ns = await w.namespace();
  const id = await source.newIdentity(fx.allowList(ns));
  const consumer = await w.create(fx.consumer('fan', fx.inNamespace(ns), fx.identityRef(id)));
  await mirrorOwnedBy(ns, id, consumer, 120_000);
  const binding = 'captf-mirror-sync-keys';
  const bindings = { group: 'sources.knative.dev', version: 'v1', namespace: NAMESPACE, plural: 'sinkbindings' };
  const policies = eventPolicies(NAMESPACE);
  const shipped = (await custom.getNamespacedCustomObject({ ...policies, name: 'captf-broker' })) as {
    spec: { from: unknown[] };
  };
  await custom.createNamespacedCustomObject({
    ...bindings,
    body: {
      apiVersion: 'sources.knative.dev/v1',
      kind: 'SinkBinding',
      metadata: { name: binding },
      spec: {
        subject: { apiVersion: 'serving.knative.dev/v1', kind: 'Service', name: 'captf-mirror-sync' },
        sink: { ref: { apiVersion: 'eventing.knative.dev/v1', kind: 'Broker', name: 'captf' } },
      },
    },
  });
  try {
    const revision = await explained(
      eventually(
        "mirror-sync's bound revision (K_SINK and the token) Ready, and none of its old pods serving",
        async () => {
          const s = (await custom.getNamespacedCustomObject({
            group: 'serving.knative.dev',
            version: 'v1',
            namespace: NAMESPACE,
            plural: 'services',
            name: 'captf-mirror-sync',
          })) as MirrorSyncService;
          const bound = s.spec.template.spec.containers[0]!.env?.some((e) => e.name === 'K_SINK');
          const st = s.status;
          const ready =
            st?.observedGeneration === s.metadata.generation &&
            st.latestReadyRevisionName === st.latestCreatedRevisionName &&
            st.conditions?.some((c) => c.type === 'Ready' && c.status === 'True');
          // A terminating pod takes no new request, and may drain for up to timeoutSeconds.
          const old = (await podsOf('captf-mirror-sync')).filter(
            (p) =>
              p.metadata?.labels?.['serving.knative.dev/revision'] !== st?.latestReadyRevisionName &&
              !p.metadata?.deletionTimestamp,
          );
          return bound && ready && old.length === 0 && st.latestReadyRevisionName;
        },
        300_000,
        1000,
      ),
    );
    const { audience } = config('captf-mirror-sync');
    const resyncToken = await serviceAccountToken(system.kc, {
      namespace: NAMESPACE,
      name: oidcServiceAccountName('captf-mirror-sync-resync'),
      audience,
    });
    const ping = async () => {
      const r = await postEvents(
        url('captf-mirror-sync'),
        pingEvent('captf-resync'),
        'binary',
        undefined,
        `Bearer ${resyncToken}`,
      );
      assert.equal(r.status, 200, `the resync ping: ${r.text}`);
    };
    // The shipped policy lets only the product's sources send to the Broker.
    await ping();
    await explained(
      eventually(
        `the Broker to refuse the key events of ${revision}`,
        async () => (await mirrorSyncLogs()).some((l) => /sink refused resync event.*"status":403/.test(l)),
        120_000,
        1000,
      ),
    );
    await custom.patchNamespacedCustomObject(
      {
        ...policies,
        name: 'captf-broker',
        body: {
          spec: {
            from: [
              ...shipped.spec.from,
              { ref: { apiVersion: 'sources.knative.dev/v1', kind: 'SinkBinding', name: binding } },
            ],
          },
        },
      },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
    await core.deleteNamespacedSecret({ namespace: ns, name: mirrorName(id) });
    const sentAll = (l: string) => /"message":"resync"/.test(l) && /"sent":[1-9]/.test(l) && /"failed":0\b/.test(l);
    await explained(
      eventually(
        'a resync whose key events the Broker took (Knative resolves the policy within seconds)',
        async () => {
          if (!(await mirrorSyncLogs()).some(sentAll)) await ping();
          return (await mirrorSyncLogs()).some(sentAll);
        },
        120_000,
        5000,
      ),
    );
    const back = await mirrorOwnedBy(ns, id, consumer, 120_000);
    assert.equal(Buffer.from(back.data!.AWS_ACCESS_KEY_ID!, 'base64').toString(), 'AKIA-fanout');
  } finally {
    await custom.deleteNamespacedCustomObject({ ...bindings, name: binding }).catch(() => undefined);
    await custom
      .patchNamespacedCustomObject(
        { ...policies, name: 'captf-broker', body: { spec: { from: shipped.spec.from } } },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      )
      .catch(() => undefined);
  }
}

/**
 * The node's receivers after a consumer's event: its trace in Jaeger, from Knative's spans (the
 * Broker's and Serving's, with `tracing-sampling-rate` 1) down to mirror-sync's mirror write, and
 * the counts mirror-sync's pods and Knative's components pushed to Prometheus.
 */
async function telemetryOnTheNode(): Promise<void> {
  const o = system.observability!;
  const source = await operatorSource(w, fx.data({ token: 'observed' }));
  const ns = await w.namespace();
  const id = await source.newIdentity(fx.allowList(ns));
  const consumer = await w.create(fx.consumer('traced', fx.inNamespace(ns), fx.identityRef(id)));
  await mirrorOwnedBy(ns, id, consumer, 120_000);
  const object = `${ns}/${consumer.metadata!.name}`;
  // Read while the pod is there (its log goes with it); the line comes after the mirror write.
  const reconciled = await eventually(`mirror-sync's reconcile line of ${object}`, async () =>
    (await mirrorSyncLogs())
      .map((l) => l.slice(l.indexOf('{')))
      .map((l) => (l.startsWith('{') ? (JSON.parse(l) as Record<string, unknown>) : {}))
      .find((e) => e.message === 'reconcile' && e.object === object && e.trace_id),
  );
  let spans: StoredSpan[] = [];
  const answer = () => spans.find((s) => s.name === 'POST /' && s.service === 'captf-mirror-sync');
  const underKnative = () => {
    const byId = new Map(spans.map((s) => [s.spanId, s]));
    for (let s = answer(); s; s = byId.get(s.parentSpanId)) if (!s.service.startsWith('captf-')) return true;
    return false;
  };
  await explained(
    eventually(
      "mirror-sync's answer under Knative's spans in Jaeger",
      async () => {
        spans = await o.jaeger.trace(String(reconciled.trace_id));
        return underKnative() && spans.some((s) => s.name === 'create secrets');
      },
      120_000,
      1000,
    ),
  ).catch((err: unknown) => {
    const services = [...new Set(spans.map((s) => `${s.service}: ${s.name}`))].join('; ');
    throw new Error(`${(err as Error).message}\nspans: ${services}`);
  });
  // A pod pushes every 15 s and once more as it stops; Serving's activator and Eventing's filter too.
  await eventually(
    "mirror-sync's and Knative's own metrics in Prometheus",
    async () => {
      const events = await o.prometheus.query('sum(captf_events_total{job="captf-mirror-sync"})');
      const jobs = (await o.prometheus.query('count by (job) ({__name__=~".+", job=~"activator|broker.filter"})')).map(
        (x) => x.metric.job,
      );
      return (events[0]?.value ?? 0) > 0 && jobs.includes('activator') && jobs.includes('broker.filter');
    },
    120_000,
    1000,
  );
}
