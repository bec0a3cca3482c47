/**
 * The event wiring in the rendered manifests matches what the functions accept (SPEC §12,
 * §13): Trigger and PingSource event types, ApiServerSource resources
 * (turned into events exactly as the adapter sends them and classified by the functions'
 * own parser), consumer kinds from configuration, the webhook's rules, and RBAC for every
 * sourced resource; `Retry-After` honoured only where the cluster allows it (the
 * retry-after overlay); and each function's drain deadline against its revision's timeout.
 */
import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { CloudEvent } from 'cloudevents';
import type { KubernetesObject } from '@kubernetes/client-node';
import { DEFAULT_CONSUMER_KINDS, IDENTITY_RESOURCE } from '../../functions/lib/api.ts';
import {
  APISERVER_EVENT_TYPES,
  KEY_EVENT_TYPE,
  PING_EVENT_TYPE,
  REF_EVENT_PREFIX,
  classifyEvent,
} from '../../functions/lib/cloudevents.ts';
import { consumerKindsFromEnv } from '../../functions/lib/consumers.ts';
import { drainMsFromEnv } from '../../functions/lib/http.ts';
import { MAX_RETRY_AFTER_SECONDS } from '../../functions/lib/retry-after.ts';
import { eventAuthFromEnv, isSender, oidcServiceAccountName } from '../../functions/lib/senders.ts';
import { DEFAULT_PREPARE_AUDIENCE } from '../../functions/mirror-sync/authorize.ts';
import { ASYNC_HANDLER } from '../../scripts/eventing/controllers.ts';
import { KNATIVE_LAYOUT, render } from '../../scripts/tools/kustomize.ts';

interface Trigger {
  metadata: { name: string };
  spec: {
    filter?: { attributes?: Record<string, string> };
    subscriber: { ref: { kind: string; name: string }; audience?: string };
    delivery?: {
      retry?: number;
      backoffPolicy?: string;
      backoffDelay?: string;
      deadLetterSink?: { ref?: { name: string } };
      retryAfterMax?: string;
    };
  };
}
interface ApiServerSource {
  metadata: { name: string; namespace: string };
  spec: {
    mode: string;
    namespaceSelector?: object;
    serviceAccountName: string;
    resources: { apiVersion: string; kind: string; selector?: unknown }[];
    sink: { ref: { kind: string; name: string } };
  };
}
interface PingSource {
  metadata: { name: string; namespace: string };
  spec: { schedule: string; sink: { ref: { kind: string; name: string } } };
}
interface Rule {
  apiGroups?: string[];
  resources?: string[];
  verbs: string[];
}

const kinds = consumerKindsFromEnv({});
const of = <T>(objs: KubernetesObject[], kind: string) => objs.filter((o) => o.kind === kind) as unknown as T[];
let base: KubernetesObject[];
let fast: KubernetesObject[];
let retryAfter: KubernetesObject[];
/** Every function as a Knative Service. */
let knative: KubernetesObject[];

before(async () => {
  base = await render('manifests');
  fast = await render('manifests/overlays/secret-fast-path');
  retryAfter = await render('manifests/overlays/retry-after');
  knative = await render(KNATIVE_LAYOUT);
});

/** The environment of Knative Service `name`'s container in `objs`. */
function envOf(objs: KubernetesObject[], name: string): Record<string, string> {
  const svc = objs.find(
    (o) => o.kind === 'Service' && o.apiVersion === 'serving.knative.dev/v1' && o.metadata?.name === name,
  ) as { spec: { template: { spec: { containers: { env?: { name: string; value?: string }[] }[] } } } } | undefined;
  assert.ok(svc, `Knative Service ${name}`);
  return Object.fromEntries((svc.spec.template.spec.containers[0]!.env ?? []).map((e) => [e.name, e.value ?? '']));
}

/** The ClusterRole/Role rules of one ServiceAccount's roles (bound by name in the manifests). */
function rulesOf(objs: KubernetesObject[], sa: string): Rule[] {
  return objs
    .filter((o) => (o.kind === 'ClusterRole' || o.kind === 'Role') && o.metadata?.name?.startsWith(sa))
    .flatMap((o) => (o as unknown as { rules: Rule[] }).rules);
}
const allows = (rules: Rule[], group: string, resource: string, verb: string) =>
  rules.some(
    (r) => (r.apiGroups ?? []).includes(group) && (r.resources ?? []).includes(resource) && r.verbs.includes(verb),
  );

/** A CloudEvent exactly as the ApiServerSource adapter sends it in Reference mode. */
function refEvent(apiVersion: string, kind: string, verb: string, namespace: string | undefined): CloudEvent<unknown> {
  return new CloudEvent<unknown>({
    specversion: '1.0',
    id: 'x',
    type: `${REF_EVENT_PREFIX}${verb}`,
    source: 'https://kubernetes.default.svc',
    subject: '/x',
    datacontenttype: 'application/json',
    data: { apiVersion, kind, name: 'n', ...(namespace ? { namespace } : {}) },
    kind,
    name: 'n',
    namespace: namespace ?? '',
    apiversion: apiVersion,
  });
}

describe('event wiring vs. what the functions accept', () => {
  it('every Trigger filters on an event type the functions accept and has retrying, dead-lettered delivery', () => {
    const triggers = of<Trigger>(base, 'Trigger');
    assert.ok(triggers.length >= 8);
    for (const t of triggers) {
      const type = t.spec.filter?.attributes?.type;
      assert.ok(
        type && (APISERVER_EVENT_TYPES.includes(type) || type === PING_EVENT_TYPE || type === KEY_EVENT_TYPE),
        `${t.metadata.name}: ${type}`,
      );
      assert.ok((t.spec.delivery?.retry ?? 0) >= 3, t.metadata.name);
      assert.equal(t.spec.delivery?.backoffPolicy, 'exponential');
      assert.match(t.spec.delivery?.backoffDelay ?? '', /^PT\d+(\.\d+)?S$/);
      assert.equal(t.spec.delivery?.deadLetterSink?.ref?.name, 'captf-dead-letters');
      assert.equal(t.spec.subscriber.ref.kind, 'Service');
    }
  });

  it("Retry-After: only overlays/retry-after sets retryAfterMax, on mirror-sync's Triggers, to mirror-sync's cap", () => {
    // Knative's webhook refuses retryAfterMax unless config-features enables delivery-retryafter.
    assert.deepEqual(
      of<Trigger>(base, 'Trigger').filter((t) => t.spec.delivery?.retryAfterMax !== undefined),
      [],
      'the entry point applies on a cluster with the flag off',
    );
    const set = of<Trigger>(retryAfter, 'Trigger').filter((t) => t.spec.delivery?.retryAfterMax !== undefined);
    assert.deepEqual(
      set.map((t) => t.metadata.name).sort(),
      of<Trigger>(base, 'Trigger')
        .filter((t) => t.spec.subscriber.ref.name === 'captf-mirror-sync')
        .map((t) => t.metadata.name)
        .sort(),
    );
    for (const t of set) assert.equal(t.spec.delivery!.retryAfterMax, `PT${MAX_RETRY_AFTER_SECONDS}S`);
    // Nothing else differs from the entry point.
    const stripped = structuredClone(retryAfter);
    for (const t of of<Trigger>(stripped, 'Trigger')) delete t.spec.delivery?.retryAfterMax;
    assert.deepEqual(stripped, base);
  });

  it('mirror-sync gets every Reference-mode event (no filter but the type); identity-status gets identity events', () => {
    const triggers = of<Trigger>(base, 'Trigger');
    for (const verb of ['add', 'update', 'delete']) {
      const type = `${REF_EVENT_PREFIX}${verb}`;
      assert.ok(
        triggers.some(
          (t) =>
            t.spec.subscriber.ref.name === 'captf-mirror-sync' &&
            JSON.stringify(t.spec.filter?.attributes) === JSON.stringify({ type }),
        ),
        type,
      );
      assert.ok(
        triggers.some(
          (t) =>
            t.spec.subscriber.ref.name === 'captf-identity-status' &&
            t.spec.filter?.attributes?.type === type &&
            t.spec.filter.attributes.kind === IDENTITY_RESOURCE.kind,
        ),
        type,
      );
    }
  });

  it('the mirror keys a resync fans out (K_SINK) are routed back to mirror-sync, and mirror-sync accepts them', () => {
    const triggers = of<Trigger>(base, 'Trigger').filter((t) => t.spec.filter?.attributes?.type === KEY_EVENT_TYPE);
    assert.deepEqual(
      triggers.map((t) => t.spec.subscriber.ref.name),
      ['captf-mirror-sync'],
    );
    const ev = new CloudEvent<unknown>({
      specversion: '1.0',
      id: 'k',
      type: KEY_EVENT_TYPE,
      source: 'captf',
      datacontenttype: 'application/json',
      data: { namespace: 'team-a', identity: 'aws' },
    });
    assert.deepEqual(classifyEvent(ev, DEFAULT_CONSUMER_KINDS), {
      type: 'key',
      id: 'k',
      namespace: 'team-a',
      identity: 'aws',
    });
  });

  it('ApiServerSources run in Reference mode into the Broker, and each resource they source classifies as a known target', () => {
    const brokers = of<KubernetesObject>(base, 'Broker').map((b) => b.metadata!.name);
    for (const [objs, expected] of [
      [base, ['consumer', 'identity', 'namespace']],
      [fast, ['consumer', 'identity', 'namespace', 'secret']],
    ] as const) {
      const seen = new Set<string>();
      for (const s of of<ApiServerSource>(objs, 'ApiServerSource')) {
        assert.equal(s.spec.mode, 'Reference', s.metadata.name);
        assert.equal(s.spec.serviceAccountName, 'captf-event-sources');
        assert.ok(s.spec.sink.ref.kind === 'Broker' && brokers.includes(s.spec.sink.ref.name));
        for (const r of s.spec.resources) {
          for (const verb of ['add', 'update', 'delete']) {
            const req = classifyEvent(
              refEvent(
                r.apiVersion,
                r.kind,
                verb,
                r.kind === 'Namespace' || r.kind === IDENTITY_RESOURCE.kind ? undefined : 'team-a',
              ),
              kinds,
            );
            assert.ok(
              req.type === 'object' && req.target !== 'other' && req.verb === verb,
              `${r.apiVersion} ${r.kind}`,
            );
            seen.add(req.type === 'object' ? req.target : '');
          }
        }
      }
      assert.deepEqual([...seen].sort(), [...expected].sort());
    }
  });

  it('every configured consumer kind is sourced, and every account that touches consumers has RBAC for it', () => {
    const sourced = of<ApiServerSource>(base, 'ApiServerSource').flatMap((s) =>
      s.spec.resources.map((r) => `${r.apiVersion}/${r.kind}`),
    );
    const objects = of<ApiServerSource>(base, 'ApiServerSource').find((s) =>
      s.spec.resources.some((r) => r.kind === kinds[0]!.kind),
    )!;
    assert.deepEqual(objects.spec.namespaceSelector, {}, 'consumers are watched in every namespace');
    for (const k of kinds) {
      assert.ok(sourced.includes(`${k.group}/${k.version}/${k.kind}`), k.kind);
      for (const v of ['get', 'list', 'watch'])
        assert.ok(allows(rulesOf(base, 'captf-event-sources'), k.group, k.plural, v), `event sources ${v} ${k.plural}`);
      for (const v of ['get', 'list'])
        assert.ok(allows(rulesOf(base, 'captf-mirror-sync'), k.group, k.plural, v), `mirror-sync ${v} ${k.plural}`);
      assert.ok(allows(rulesOf(base, 'captf-mirror-sync'), k.group, `${k.plural}/status`, 'patch'));
      assert.ok(allows(rulesOf(base, 'captf-admission'), k.group, k.plural, 'list'));
      assert.ok(allows(rulesOf(base, 'captf-identity-status'), k.group, k.plural, 'list'));
      // SPEC §5: the manager's role lets it call prepare for every configured kind.
      assert.ok(
        allows(rulesOf(base, 'captf-prepare'), k.group, `${k.plural}/prepare`, 'create'),
        `prepare ${k.plural}`,
      );
    }
    assert.ok(
      sourced.includes(`${IDENTITY_RESOURCE.group}/${IDENTITY_RESOURCE.version}/${IDENTITY_RESOURCE.kind}`) &&
        sourced.includes('v1/Namespace'),
    );
    // The fast path's Secrets: the event-source account reads them in its own namespace only.
    assert.ok(!allows(rulesOf(base, 'captf-event-sources'), '', 'secrets', 'watch'));
    const role = of<KubernetesObject & { rules: Rule[] }>(fast, 'Role').find(
      (r) => r.metadata?.name === 'captf-event-sources-secrets',
    )!;
    assert.equal(role.metadata?.namespace, 'captf-system');
    assert.deepEqual(role.rules, [{ apiGroups: [''], resources: ['secrets'], verbs: ['get', 'list', 'watch'] }]);
  });

  it('PingSources tick every 5 (identity-status) and 10 (resync) minutes and reach their function by type and source', () => {
    const triggers = of<Trigger>(base, 'Trigger');
    const pings = of<PingSource>(base, 'PingSource');
    const want: Record<string, [string, string]> = {
      'captf-identity-status': ['*/5 * * * *', 'captf-identity-status'],
      'captf-resync': ['*/10 * * * *', 'captf-mirror-sync'],
    };
    assert.deepEqual(pings.map((p) => p.metadata.name).sort(), Object.keys(want).sort());
    for (const p of pings) {
      const [schedule, fn] = want[p.metadata.name]!;
      assert.equal(p.spec.schedule, schedule);
      assert.equal(p.spec.sink.ref.kind, 'Broker');
      const source = `/apis/v1/namespaces/${p.metadata.namespace}/pingsources/${p.metadata.name}`;
      const t = triggers.filter(
        (x) => x.spec.filter?.attributes?.type === PING_EVENT_TYPE && x.spec.filter.attributes.source === source,
      );
      assert.deepEqual(
        t.map((x) => x.spec.subscriber.ref.name),
        [fn],
      );
    }
  });

  it('the webhook covers only the identity resource, fails closed, and calls admission at /validate', () => {
    const [vwc] = of<{
      metadata: { annotations: Record<string, string> };
      webhooks: {
        failurePolicy: string;
        sideEffects: string;
        timeoutSeconds: number;
        clientConfig: { service: { name: string; path: string } };
        rules: { apiGroups: string[]; apiVersions: string[]; resources: string[]; operations: string[] }[];
      }[];
    }>(base, 'ValidatingWebhookConfiguration');
    assert.ok(vwc);
    const w = vwc.webhooks[0]!;
    assert.equal(w.failurePolicy, 'Fail');
    assert.equal(w.sideEffects, 'None');
    assert.ok(w.timeoutSeconds >= 15 && w.timeoutSeconds <= 30);
    assert.deepEqual(w.clientConfig.service, { ...w.clientConfig.service, name: 'captf-admission', path: '/validate' });
    assert.deepEqual(w.rules, [
      {
        apiGroups: [IDENTITY_RESOURCE.group],
        apiVersions: [IDENTITY_RESOURCE.version],
        resources: [IDENTITY_RESOURCE.plural],
        operations: ['CREATE', 'UPDATE', 'DELETE'],
        scope: 'Cluster',
      },
    ]);
    const [ns, name] = vwc.metadata.annotations['cert-manager.io/inject-ca-from']!.split('/');
    assert.ok(
      of<KubernetesObject>(base, 'Certificate').some((c) => c.metadata?.namespace === ns && c.metadata?.name === name),
    );
  });
});

describe('the Knative Services', () => {
  it("each function's drain deadline is its revision's timeoutSeconds (Knative's grace period), a value it accepts", () => {
    const services = of<{
      metadata: { name: string };
      spec: {
        template: {
          spec: { timeoutSeconds: number; containers: { args?: string[]; env?: { name: string; value?: string }[] }[] };
        };
      };
    }>(knative, 'Service').filter((s) => s.spec.template.spec.containers[0]!.args?.length);
    assert.deepEqual(services.map((s) => s.spec.template.spec.containers[0]!.args![0]).sort(), [
      'admission',
      'dead-letters',
      'identity-status',
      'mirror-sync',
    ]);
    for (const s of services) {
      const { timeoutSeconds, containers } = s.spec.template.spec;
      const env = Object.fromEntries((containers[0]!.env ?? []).map((e) => [e.name, e.value]));
      assert.equal(env.CAPTF_DRAIN_SECONDS, String(timeoutSeconds), s.metadata.name);
      assert.equal(drainMsFromEnv(env), timeoutSeconds * 1000, s.metadata.name);
    }
  });
});

describe('who may send events (SPEC §12)', () => {
  it("each event function checks senders as shipped: its Triggers' audience and exactly their OIDC ServiceAccounts", () => {
    for (const layout of [base, knative]) {
      const triggers = of<Trigger & { metadata: { namespace: string } }>(layout, 'Trigger');
      for (const fn of ['captf-mirror-sync', 'captf-identity-status']) {
        const env = envOf(layout, fn);
        const config = eventAuthFromEnv(env);
        assert.equal(config.mode, 'oidc', `${fn} verifies its senders as shipped`);
        if (config.mode !== 'oidc') continue;
        const mine = triggers.filter((t) => t.spec.subscriber.ref.name === fn);
        assert.ok(mine.length > 0, fn);
        for (const t of mine)
          assert.equal(t.spec.subscriber.audience, config.audience, `${t.metadata.name}'s audience`);
        const want = mine.map(
          (t) => `system:serviceaccount:${t.metadata.namespace}:${oidcServiceAccountName(t.metadata.name)}`,
        );
        assert.deepEqual([...config.senders].sort(), want.sort(), `${fn}'s senders are its Triggers' ServiceAccounts`);
        // Another function's Trigger may not send here: one Trigger's token is no key to every function.
        for (const other of triggers.filter((t) => t.spec.subscriber.ref.name !== fn))
          assert.ok(
            !isSender(
              `system:serviceaccount:${other.metadata.namespace}:${oidcServiceAccountName(other.metadata.name)}`,
              config.senders,
            ),
          );
      }
      const audiences = triggers.map((t) => t.spec.subscriber.audience);
      assert.ok(!audiences.includes(DEFAULT_PREPARE_AUDIENCE), "no Trigger's token is good for prepare");
    }
  });

  it('dead-letters takes dead letters signed as any Trigger, for the audience every dead-letter sink sets, and nothing else', () => {
    for (const layout of [base, knative]) {
      const config = eventAuthFromEnv(envOf(layout, 'captf-dead-letters'));
      assert.equal(config.mode, 'oidc', 'dead-letters verifies its senders as shipped');
      if (config.mode !== 'oidc') continue;
      type WithSink = {
        metadata: { name: string; namespace: string };
        spec: { delivery?: { deadLetterSink?: { ref?: { name: string }; audience?: string } } };
      };
      const triggers = of<WithSink>(layout, 'Trigger');
      for (const o of [...triggers, ...of<WithSink>(layout, 'Broker')]) {
        const sink = o.spec.delivery?.deadLetterSink;
        assert.equal(sink?.ref?.name, 'captf-dead-letters', o.metadata.name);
        assert.equal(
          sink?.audience,
          config.audience,
          `${o.metadata.name}: Knative signs its dead letters for dead-letters`,
        );
      }
      const want = triggers.map(
        (t) => `system:serviceaccount:${t.metadata.namespace}:${oidcServiceAccountName(t.metadata.name)}`,
      );
      assert.deepEqual(
        [...config.senders].sort(),
        want.sort(),
        "its senders are exactly the Triggers' ServiceAccounts",
      );
      const audiences = of<Trigger>(layout, 'Trigger').map((t) => t.spec.subscriber.audience);
      assert.ok(!audiences.includes(config.audience), "no function's delivery token is good for dead-letters");
    }
  });

  it("each function's EventPolicy targets it and names exactly its Triggers; the Broker's names exactly the sources", () => {
    type Ref = { apiVersion: string; kind: string; name: string };
    type Policy = { metadata: { name: string }; spec: { to: { ref: Ref }[]; from: { ref: Ref }[] } };
    for (const layout of [base, knative]) {
      const policies = of<Policy>(layout, 'EventPolicy');
      const byTarget = (kind: string, name: string) =>
        policies.filter((p) => p.spec.to.some((t) => t.ref.kind === kind && t.ref.name === name));
      const named = (p: Policy, kind: string) =>
        p.spec.from
          .filter((f) => f.ref.kind === kind)
          .map((f) => f.ref.name)
          .sort();
      for (const fn of ['captf-mirror-sync', 'captf-identity-status']) {
        const [policy, ...more] = byTarget('Service', fn);
        assert.ok(policy && more.length === 0, `${fn} has one EventPolicy`);
        const triggers = of<Trigger>(layout, 'Trigger').filter((t) => t.spec.subscriber.ref.name === fn);
        assert.deepEqual(named(policy, 'Trigger'), triggers.map((t) => t.metadata.name).sort(), fn);
        assert.equal(policy.spec.from.length, triggers.length, `${fn}: nothing but its Triggers`);
      }
      const broker = of<KubernetesObject>(layout, 'Broker')[0]!.metadata!.name!;
      const [policy] = byTarget('Broker', broker);
      assert.ok(policy, 'the Broker has an EventPolicy');
      assert.deepEqual(
        named(policy, 'ApiServerSource'),
        of<KubernetesObject>(layout, 'ApiServerSource').map((o) => o.metadata!.name!),
      );
      assert.deepEqual(
        named(policy, 'PingSource'),
        of<KubernetesObject>(layout, 'PingSource')
          .map((o) => o.metadata!.name!)
          .sort(),
      );
    }
  });

  it('components/unsigned-events turns the check off in both event functions and nothing else', async () => {
    const unsigned = await render('manifests/overlays/unsigned-events');
    for (const fn of ['captf-mirror-sync', 'captf-identity-status'])
      assert.deepEqual(eventAuthFromEnv(envOf(unsigned, fn)), { mode: 'off' }, fn);
    const strip = (objs: KubernetesObject[]) =>
      JSON.stringify(objs).replace(/"name":"CAPTF_EVENT_AUTH","value":"(oidc|off)"/g, '');
    assert.equal(strip(unsigned), strip(base));
  });
});

describe('the delivery the manifests ship', () => {
  it('the Broker carries the async-handler annotation (docs/deploy-knative.md, "The delivery default")', () => {
    for (const objs of [base, fast]) {
      const [broker, ...more] = of<KubernetesObject>(objs, 'Broker');
      assert.equal(more.length, 0);
      assert.equal(broker!.metadata!.annotations?.[ASYNC_HANDLER], 'true');
    }
  });
});
