/**
 * `POST /` of mirror-sync: CloudEvents in, mirror keys reconciled, one HTTP answer out:
 * 200 when every key's work is done, 503 when something should be retried (Knative delivery
 * retries), 400 for events this function cannot use. The answer names nothing; what was decided
 * goes to the log (lib/http.ts `sendEventOutcome`).
 * A consumer's event maps to mirror keys (keys.ts) — or to nothing, for the echo of our own status
 * write; an identity's or a namespace's event to that name's pass; a ping to the resync. All of
 * it is asked of the scheduler (scheduler.ts: one queue of names, one worker function), which answers once
 * the work is done; this file only reads events and writes answers.
 */
import type { Request, Response } from 'express';
import { BadEventError, readEventRequests, type EventRequest, type ObjectRef } from '../lib/cloudevents.ts';
import { sendEventOutcome, type Outcome } from '../lib/http.ts';
import type { Consumer } from '../lib/api.ts';
import { findConsumerKind, scopeMismatch } from '../lib/consumers.ts';
import { describeError, retryAfterOf } from '../lib/kube.ts';
import { telemetry, type EventKind, type EventResult, type SpanAttributes } from '../lib/telemetry.ts';
import { largestRetryAfter, retryAfterHeader } from '../lib/retry-after.ts';
import { contextOf, settleWithoutKey, type ConsumerResult, type ReconcileContext, type ReconcileDeps } from './act.ts';
import { keyString } from './decide.ts';
import { keysForConsumer, type KeyWork } from './keys.ts';
import { identitiesUsingSecret } from './observe.ts';
import { consumerFields, type KeyResult } from './reconcile.ts';
import type { ResyncSummary } from './resync.ts';
import type { PassDone, Scheduler, SchedulerConfig } from './scheduler.ts';

/** mirror-sync's configuration (from the environment, see index.ts). */
export interface EventConfig extends SchedulerConfig {
  /** SPEC §8 fast path: react to labelled source-Secret events. */
  sourceSecretEvents: boolean;
}

/** Label that opts a source Secret into the rotation fast path (SPEC §8). */
const SOURCE_LABEL = 'captf.io/identity-source';

/** An object event (not a ping or a key). */
type ObjectEvent = Extract<EventRequest, { type: 'object' }>;

type Done = {
  id: string;
  results?: Pick<ConsumerResult, 'object' | 'outcome' | 'reason' | 'retry'>[];
  keys?: string[];
  resync?: ResyncSummary;
  failed?: string;
  /** With `failed`: the largest wait a throttled API server asked for in this event's work, as answered in `Retry-After` (whole seconds, 1–30). */
  retryAfterSeconds?: number;
  /** Why an event needed no work (a Secret without the source label, the echo of a decision already written). */
  skipped?: string;
};

/**
 * Drops repeated work from one request: pings beyond the first, and events naming the same
 * object or key as an earlier one (each reconcile re-reads everything, so once is enough).
 */
function withoutRepeats(requests: readonly EventRequest[]): EventRequest[] {
  const seen = new Set<string>();
  return requests.filter((r) => {
    const key =
      r.type === 'ping'
        ? 'ping'
        : r.type === 'key'
          ? `key/${r.namespace}/${r.identity}`
          : JSON.stringify([r.target, r.ref.apiVersion, r.ref.kind, r.ref.namespace ?? '', r.ref.name]);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** mirror-sync's event handling: CloudEvents in, work asked of the scheduler, answers out. */
export class MirrorSyncHandler {
  private readonly deps: ReconcileDeps;
  private readonly scheduler: Scheduler;
  private readonly sourceSecretEvents: boolean;

  /**
   * @param deps API access, consumer kinds, logger.
   * @param scheduler the process's one scheduler (shared with prepare).
   * @param cfg the fast-path switch.
   */
  constructor(deps: ReconcileDeps, scheduler: Scheduler, cfg: Pick<EventConfig, 'sourceSecretEvents'>) {
    this.deps = deps;
    this.scheduler = scheduler;
    this.sourceSecretEvents = cfg.sourceSecretEvents;
  }

  /** Handles one classified event. @throws BadEventError for events this function cannot use; API errors. */
  async handleOne(ev: EventRequest): Promise<Done> {
    if (ev.type === 'ping') return { id: ev.id, resync: await this.scheduler.resync() };
    if (ev.type === 'key') {
      const key = { namespace: ev.namespace, identity: ev.identity };
      return this.done(ev.id, [await this.scheduler.key(key)], []);
    }
    this.checkTarget(ev);
    switch (ev.target) {
      case 'consumer':
        return this.consumerEvent(contextOf(this.deps), ev);
      case 'identity':
        return this.passDone(ev.id, await this.scheduler.identity(ev.ref.name));
      case 'namespace':
        return this.passDone(ev.id, await this.scheduler.namespace(ev.ref.name));
      default:
        return this.secretEvent(contextOf(this.deps), ev);
    }
  }

  /**
   * @throws BadEventError for objects of other kinds, a consumer placed where its kind's scope
   *   rules out (a namespaced kind without a namespace), and Secrets while the fast path is off.
   */
  private checkTarget(ev: ObjectEvent): void {
    const kind =
      ev.target === 'consumer' ? findConsumerKind(this.deps.kinds, ev.ref.apiVersion, ev.ref.kind) : undefined;
    const mismatch = kind && scopeMismatch(kind, ev.ref.namespace);
    if (mismatch) throw new BadEventError(`event ${ev.id} is about ${ev.ref.kind} ${ev.ref.name}: ${mismatch}`);
    if (ev.target === 'other')
      throw new BadEventError(
        `event ${ev.id} is about ${ev.ref.apiVersion} ${ev.ref.kind}, which mirror-sync does not handle`,
      );
    if (ev.target === 'secret' && !this.sourceSecretEvents) {
      throw new BadEventError(
        `event ${ev.id} is about a Secret, but the source-Secret fast path is off (set CAPTF_SOURCE_SECRET_EVENTS=true)`,
      );
    }
  }

  /**
   * A consumer's keys; a consumer without a key (no usable identity, or cluster-scoped) has
   * its conditions settled; a gone one says what it released. Each is logged once.
   */
  private async consumerEvent(ctx: ReconcileContext, ev: ObjectEvent): Promise<Done> {
    const found = await keysForConsumer(ctx.clients, ctx.kinds, ev.ref, { verb: ev.verb, echo: true });
    if (found.decided) return this.echo(ev, found.consumer!);
    const { keys, consumer } = found;
    const identity = consumer?.spec?.identityRef?.name;
    const direct: ConsumerResult[] = [];
    if (consumer && !keys.some((k) => k.key.identity === identity)) direct.push(await settleWithoutKey(ctx, consumer));
    const results = await this.releaseThenOwn(keys, identity);
    if (!consumer) direct.push(goneResult(ev.ref, results));
    for (const d of direct) this.deps.logger.info('reconcile', { ...consumerFields(d), detail: d.message });
    return this.done(ev.id, results, direct);
  }

  /**
   * A consumer event's keys: the mirrors it may still own elsewhere released first, then its
   * own key — only when every release went through, so a failed one leaves the consumer's
   * conditions unwritten and the retried event is no echo: it releases again.
   */
  private async releaseThenOwn(keys: readonly KeyWork[], identity: string | undefined): Promise<KeyResult[]> {
    const released = await this.scheduler.keys(keys.filter((k) => k.key.identity !== identity));
    if (released.some((r) => r.retry)) return released;
    return [...released, ...(await this.scheduler.keys(keys.filter((k) => k.key.identity === identity)))];
  }

  /** The answer to the echo of a decision already written (SPEC §12): nothing to do, said at debug level. */
  private echo(ev: ObjectEvent, consumer: Consumer): Done {
    const skipped = `our conditions on ${ev.ref.kind} ${ev.ref.namespace ?? ''}/${ev.ref.name} are current for generation ${consumer.metadata.generation}`;
    this.deps.logger.debug('event skipped', { id: ev.id, detail: skipped });
    return { id: ev.id, results: [], skipped };
  }

  /** SPEC §8 fast path: a labelled source Secret's change reaches the keys of the identities using it. */
  private async secretEvent(ctx: ReconcileContext, ev: ObjectEvent): Promise<Done> {
    if (!ev.ref.namespace || (ev.labels && ev.labels[SOURCE_LABEL] !== 'true')) {
      const skipped = `Secret ${ev.ref.namespace ?? ''}/${ev.ref.name} is not labelled ${SOURCE_LABEL}=true`;
      this.deps.logger.info('event skipped', { id: ev.id, detail: skipped });
      return { id: ev.id, results: [], skipped };
    }
    const passes: PassDone[] = [];
    const secret = { namespace: ev.ref.namespace, name: ev.ref.name };
    for (const identity of await identitiesUsingSecret(ctx.clients, secret))
      passes.push(await this.scheduler.identity(identity));
    return this.passDone(ev.id, {
      results: passes.flatMap((p) => p.results),
      direct: passes.flatMap((p) => p.direct),
    });
  }

  private passDone(id: string, p: PassDone): Done {
    return this.done(id, p.results, p.direct);
  }

  private done(id: string, results: readonly KeyResult[], direct: readonly ConsumerResult[]): Done {
    const consumers = [...direct, ...results.flatMap((r) => r.consumers)];
    const failed = results.filter((r) => r.error);
    return {
      id,
      results: consumers.map(({ object, outcome, reason, retry }) => ({ object, outcome, reason, retry })),
      keys: results.map((r) => keyString(r.key)),
      ...(failed.length
        ? failedWork(
            failed.map((r) => r.error),
            failed.map((r) => r.retryAfterSeconds),
          )
        : {}),
    };
  }

  /**
   * Express handler for `POST /`.
   * Answers: 200 (empty); 400 for a malformed or unusable event (valid events of a batch are
   * still processed) or a batch over `MAX_BATCH`; 503 when a reconcile asks for a retry or an
   * API call failed, with `Retry-After` when the API server throttled some of the work (the
   * largest wait it asked for, at most 30 s). The detail, `{events: [...]}` as {@link answer}
   * decides it, is logged under the answer's request id, never sent.
   */
  handle = async (req: Request, res: Response): Promise<void> => {
    sendEventOutcome(
      res,
      await this.answer(typeof req.body === 'string' ? req.body : '', req.headers),
      this.deps.logger,
    );
  };

  /**
   * One request's outcome (SPEC §12 batch policy: each event is handled on its own; a bad
   * one never drops the good ones): `retry` when some work must be retried, else
   * `bad-input` when some events were unusable, else `done`.
   */
  async answer(body: string, headers: Request['headers']): Promise<Outcome> {
    let read: ReturnType<typeof readEventRequests>;
    try {
      read = readEventRequests(headers, body, this.deps.kinds);
    } catch (err) {
      if (!(err instanceof BadEventError)) throw err;
      this.deps.logger.warn('bad event', { error: err.message });
      telemetry().event('unusable', 'bad');
      return { kind: 'bad-input', error: err.message };
    }
    const bad = [...read.bad];
    const done: Done[] = [];
    for (const r of countRepeats(read)) {
      const d = await this.traced(r);
      if (typeof d === 'string') bad.push(d);
      else done.push(d);
    }
    if (bad.length) this.deps.logger.warn('bad event', { errors: bad });
    const badEvents = bad.length ? { badEvents: bad } : {};
    if (done.some(needsRetry))
      return {
        kind: 'retry',
        error: 'some reconciles must be retried',
        body: { events: done, ...badEvents },
        retryAfterSeconds: largestRetryAfter(done.map((d) => d.retryAfterSeconds)),
      };
    if (bad.length) return { kind: 'bad-input', error: bad.join('; '), body: { events: done } };
    return { kind: 'done', body: { events: done } };
  }

  /** {@link settle} in a span named after what the event asks, counted by how it ended (lib/telemetry.ts). */
  private traced(r: EventRequest): Promise<Done | string> {
    const kind = eventKind(r);
    return telemetry().span(`event ${kind}`, { attributes: eventAttributes(r) }, async (span) => {
      const d = await this.settle(r);
      const result = eventResult(d);
      telemetry().event(kind, result);
      span.set({ 'captf.result': result });
      return d;
    });
  }

  /** One event's work, its failure as `failed`, or the message of a bad event. */
  private async settle(r: EventRequest): Promise<Done | string> {
    try {
      return await this.handleOne(r);
    } catch (err) {
      if (err instanceof BadEventError) return err.message;
      this.deps.logger.warn('event failed', { id: r.id, error: describeError(err) });
      return { id: r.id, ...failedWork([describeError(err)], [retryAfterOf(err)]) };
    }
  }
}

/**
 * What an event says about its failed work: `failed` naming every failure, and the largest
 * wait a throttled API server asked for in it (capped, lib/retry-after.ts), when one did.
 */
function failedWork(
  errors: readonly (string | undefined)[],
  waits: readonly (number | undefined)[],
): Pick<Done, 'failed' | 'retryAfterSeconds'> {
  const wait = largestRetryAfter(waits);
  // In the body as in the header: whole seconds, 1 to 30.
  const asked = wait === undefined ? {} : { retryAfterSeconds: Number(retryAfterHeader(wait)) };
  return { failed: errors.join('; '), ...asked };
}

/**
 * A request's events without repeats ({@link withoutRepeats}), having counted the unusable ones
 * and the repeats (lib/telemetry.ts); the others are counted once handled.
 */
function countRepeats(read: ReturnType<typeof readEventRequests>): EventRequest[] {
  read.bad.forEach(() => telemetry().event('unusable', 'bad'));
  const unique = withoutRepeats(read.requests);
  const kept = new Set(unique);
  for (const r of read.requests) if (!kept.has(r)) telemetry().event(eventKind(r), 'skipped');
  return unique;
}

/** What an event asked, as counted (lib/telemetry.ts): a ping, a key, or its object's target. */
const eventKind = (r: EventRequest): EventKind =>
  r.type === 'object' ? (r.target === 'other' ? 'unusable' : r.target) : r.type;

/** A span's attributes for an event: its id and what it names (never its data). */
function eventAttributes(r: EventRequest): SpanAttributes {
  const id = { 'cloudevents.event_id': r.id };
  if (r.type === 'key') return { ...id, 'k8s.namespace.name': r.namespace, 'captf.identity': r.identity };
  if (r.type !== 'object') return id;
  const named: SpanAttributes = { ...id, 'captf.object': `${r.ref.kind}/${r.ref.name}`, 'captf.verb': r.verb };
  if (r.ref.namespace) named['k8s.namespace.name'] = r.ref.namespace;
  return named;
}

/** How an event ended, as counted: a bad event's message, or its work's result. */
const eventResult = (d: Done | string): EventResult => {
  if (typeof d === 'string') return 'bad';
  if (needsRetry(d)) return 'retry';
  return d.skipped ? 'skipped' : 'done';
};

/** Whether an event's work must be retried (a result asks for it, or the work failed). */
const needsRetry = (d: Done): boolean => Boolean(d.results?.some((x) => x.retry) || d.failed);

/** The result for a consumer event whose object is gone: what its keys released. */
function goneResult(ref: ObjectRef, results: readonly KeyResult[]): ConsumerResult {
  const released = results.filter((r) => r.mirrorAction === 'updated' || r.mirrorAction === 'deleted').length;
  return {
    object: `${ref.namespace ?? ''}/${ref.name}`,
    kind: ref.kind,
    outcome: 'gone',
    reason: 'ObjectGone',
    message: `object is gone; released ${released} mirror(s)`,
    retry: false,
  };
}
