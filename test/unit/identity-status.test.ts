import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  DEFAULT_CONSUMER_KINDS,
  IDENTITY_RESOURCE,
  TERRAFORM_CLUSTER,
  type Condition,
  type TerraformClusterIdentity,
} from '../../functions/lib/api.ts';
import { CloudEvent } from 'cloudevents';
import { classifyEvent } from '../../functions/lib/cloudevents.ts';
import { planFor, unsupported } from '../../functions/identity-status/handler.ts';
import { statusConfigFromEnv } from '../../functions/identity-status/index.ts';
import {
  decideStatus,
  namespacesInUse,
  readyCondition,
  statusApplyBody,
  type SourceState,
} from '../../functions/identity-status/decide.ts';
import { apiServerEvent, pingEvent, type EventObject } from '../helpers/events.ts';
import * as fx from '../helpers/fixtures.ts';

const t1 = new Date('2026-03-01T10:00:00.500Z');
const t2 = new Date('2026-03-02T10:00:00Z');
/** The identity under test: generation 3, read at resourceVersion 42, source captf-system/aws-creds. */
const awsProd = (...mods: fx.Modifier<TerraformClusterIdentity>[]) =>
  fx.identity('aws-prod', fx.secretRef('captf-system', 'aws-creds'), fx.stored(3, '42'), ...mods);
const cond = (c: Partial<Condition>): Condition => ({
  type: 'Ready',
  status: 'True',
  reason: 'SecretFound',
  message: 'source Secret captf-system/aws-creds exists',
  lastTransitionTime: '2026-01-01T00:00:00Z',
  observedGeneration: 3,
  ...c,
});
const noUse = { consumerNamespaces: [], mirrorNamespaces: [] };

describe('identity-status: Ready condition (SPEC §9)', () => {
  const table: [SourceState, 'True' | 'False', string, RegExp][] = [
    ['found', 'True', 'SecretFound', /captf-system\/aws-creds exists/],
    ['not-found', 'False', 'SecretNotFound', /captf-system\/aws-creds does not exist/],
    ['forbidden', 'False', 'SecretUnreadable', /not allowed to get source Secret captf-system\/aws-creds \(403\)/],
    // The fixture's name is not reserved; the reason and words come from the state alone.
    ['is-mirror', 'False', 'SecretIsMirror', /^inert: .*reserved for the mirrors/],
  ];
  for (const [source, status, reason, message] of table) {
    it(`source ${source} → Ready=${status}/${reason} with observedGeneration`, () => {
      const c = readyCondition(awsProd(), source);
      assert.equal(c.type, 'Ready');
      assert.equal(c.status, status);
      assert.equal(c.reason, reason);
      assert.match(c.message, message);
      assert.equal(c.observedGeneration, 3);
    });
  }
});

describe('identity-status: status.namespaces (SPEC §9)', () => {
  const table: [string, string[], string[], string[]][] = [
    ['nothing in use', [], [], []],
    ['consumers only, duplicates collapse', ['b', 'a', 'b'], [], ['a', 'b']],
    ['mirrors only (users gone, mirror left)', [], ['z'], ['z']],
    ['union, sorted by code unit', ['team-b', 'Team-A'], ['team-b', 'a'], ['Team-A', 'a', 'team-b']],
    ['the empty name is dropped', [''], ['x'], ['x']],
  ];
  for (const [what, consumerNamespaces, mirrorNamespaces, want] of table) {
    it(what, () => assert.deepEqual(namespacesInUse({ consumerNamespaces, mirrorNamespaces }), want));
  }
});

describe('identity-status: change detection', () => {
  const ready = fx.conditions(cond({}));
  const table: [string, fx.Modifier<TerraformClusterIdentity>[], SourceState, string[], string[]][] = [
    ['fresh identity, no users: Ready only', [], 'found', [], ['Ready']],
    ['fresh identity with a user: both', [], 'found', ['a'], ['Ready', 'namespaces']],
    ['nothing changed', [ready, fx.inUseIn('a')], 'found', ['a'], []],
    ['absent namespaces equal an empty list', [ready], 'found', [], []],
    ['status flips', [ready, fx.inUseIn()], 'not-found', [], ['Ready']],
    [
      'reason changes, status does not',
      [fx.conditions(cond({ status: 'False', reason: 'SecretNotFound', message: 'x' })), fx.inUseIn()],
      'forbidden',
      [],
      ['Ready'],
    ],
    ['message changes only', [fx.conditions(cond({ message: 'old words' })), fx.inUseIn()], 'found', [], ['Ready']],
    ['generation moved on', [fx.conditions(cond({ observedGeneration: 2 })), fx.inUseIn()], 'found', [], ['Ready']],
    ['namespace added', [ready, fx.inUseIn('a')], 'found', ['a', 'b'], ['namespaces']],
    ['namespace removed', [ready, fx.inUseIn('a', 'b')], 'found', ['b'], ['namespaces']],
    [
      'other condition types are not ours to compare',
      [fx.conditions(cond({}), cond({ type: 'Audited', status: 'False' })), fx.inUseIn()],
      'found',
      [],
      [],
    ],
  ];
  for (const [what, status, source, used, changed] of table) {
    it(what, () => {
      const d = decideStatus(awsProd(...status), source, { consumerNamespaces: used, mirrorNamespaces: [] }, t2);
      assert.deepEqual(d.changed, changed);
    });
  }

  it('keeps lastTransitionTime unless the status flips', () => {
    const kept = decideStatus(awsProd(fx.conditions(cond({ message: 'old' }))), 'found', noUse, t2);
    assert.equal(kept.ready.lastTransitionTime, '2026-01-01T00:00:00Z');
    const flipped = decideStatus(awsProd(fx.conditions(cond({}))), 'not-found', noUse, t2);
    assert.equal(flipped.ready.lastTransitionTime, '2026-03-02T10:00:00Z');
    const fresh = decideStatus(awsProd(), 'found', noUse, t1);
    assert.equal(fresh.ready.lastTransitionTime, '2026-03-01T10:00:00Z');
  });

  it('the apply body carries only Ready, namespaces and the resourceVersion precondition', () => {
    const id = awsProd(fx.conditions(cond({ type: 'Audited' })), fx.inUseIn('old'));
    const d = decideStatus(id, 'found', { consumerNamespaces: ['a'], mirrorNamespaces: [] }, t1);
    assert.deepEqual(statusApplyBody(id, d), {
      apiVersion: `${IDENTITY_RESOURCE.group}/${IDENTITY_RESOURCE.version}`,
      kind: IDENTITY_RESOURCE.kind,
      metadata: { name: 'aws-prod', resourceVersion: '42' },
      status: { conditions: [d.ready], namespaces: ['a'] },
    });
  });
});

describe('identity-status: which events refresh what', () => {
  /** An ApiServerSource event about a built object, classified as the functions classify it. */
  const about = (o: object, mode: 'ref' | 'resource', verb: 'add' | 'update' | 'delete', plural: string) =>
    classifyEvent(apiServerEvent(o as EventObject, mode, verb, plural), DEFAULT_CONSUMER_KINDS);
  const idRef = (name: string) => about(fx.identity(name), 'ref', 'update', IDENTITY_RESOURCE.plural);
  const idObj = (name: string) => about(fx.identity(name), 'resource', 'delete', IDENTITY_RESOURCE.plural);
  const ping = classifyEvent(pingEvent(), DEFAULT_CONSUMER_KINDS);

  it('identity events in either mode name identities, once each, in order', () => {
    assert.deepEqual(planFor([idRef('b'), idObj('a'), idRef('b')]), { kind: 'named', names: ['b', 'a'] });
  });
  it('an event that carries the object only in its data (no kind or name extensions) is read from the data', () => {
    const dataOnly = (type: string, data: object) =>
      classifyEvent(
        new CloudEvent<unknown>({
          specversion: '1.0',
          id: 'x',
          source: '/s',
          type,
          datacontenttype: 'application/json',
          data,
        }),
        DEFAULT_CONSUMER_KINDS,
      );
    const apiVersion = `${IDENTITY_RESOURCE.group}/${IDENTITY_RESOURCE.version}`;
    const kind = IDENTITY_RESOURCE.kind;
    const ref = dataOnly('dev.knative.apiserver.ref.update', { apiVersion, kind, name: 'b' });
    const resource = dataOnly('dev.knative.apiserver.resource.delete', { apiVersion, kind, metadata: { name: 'a' } });
    assert.deepEqual(planFor([ref, resource]), { kind: 'named', names: ['b', 'a'] });
  });
  it('any ping makes it a full refresh', () => {
    assert.deepEqual(planFor([idRef('b'), ping]), { kind: 'all' });
  });
  it('an event about another kind is unsupported, named in the answer; the plan leaves it out', () => {
    const c = about(fx.consumer('c', fx.inNamespace('team-a')), 'ref', 'add', TERRAFORM_CLUSTER.plural);
    assert.match(unsupported(c) ?? '', /TerraformCluster team-a\/c \(route it to mirror-sync\)/);
    assert.deepEqual(planFor([idRef('a'), c]), { kind: 'named', names: ['a'] });
    assert.match(unsupported(about(fx.namespace('team-a'), 'resource', 'update', 'namespaces')) ?? '', /Namespace/);
    assert.equal(unsupported(idRef('a')), undefined);
    assert.equal(unsupported(ping), undefined);
  });
});

describe('identity-status: configuration', () => {
  it('defaults to concurrency 8 and every identity', () =>
    assert.deepEqual(statusConfigFromEnv({}), { concurrency: 8, identitySelector: undefined }));
  it('reads both variables', () =>
    assert.deepEqual(
      statusConfigFromEnv({ CAPTF_STATUS_CONCURRENCY: '3', CAPTF_STATUS_IDENTITY_SELECTOR: ' team=a ' }),
      { concurrency: 3, identitySelector: 'team=a' },
    ));
  for (const bad of ['0', '65', '2.5', 'many'])
    it(`refuses CAPTF_STATUS_CONCURRENCY=${bad}`, () =>
      assert.throws(() => statusConfigFromEnv({ CAPTF_STATUS_CONCURRENCY: bad }), /CAPTF_STATUS_CONCURRENCY/));
});
