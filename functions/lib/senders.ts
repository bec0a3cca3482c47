/**
 * SPEC §12, "Who may send an event": the pure decisions of sender identity. With Knative's
 * `authentication-oidc` on, the Broker's filter signs each delivery with a token for the
 * Trigger's own OIDC ServiceAccount and the audience the Trigger names; a function accepts a
 * delivery only when the API server authenticates that token for the function's audience and
 * the subject is one of its senders. The shell (HTTP, TokenReview) is sender-gate.ts.
 */
import { createHash } from 'node:crypto';

/** Environment variable: `oidc` (verify every delivery, the default) or `off`. */
export const EVENT_AUTH_ENV = 'CAPTF_EVENT_AUTH';
/** Environment variable: the audience a delivery's token must be bound to. */
export const EVENT_AUDIENCE_ENV = 'CAPTF_EVENT_AUDIENCE';
/** Environment variable: the subjects that may send, comma-separated; a trailing `*` matches any rest. */
export const EVENT_SENDERS_ENV = 'CAPTF_EVENT_SENDERS';
/** Environment variable: seconds a verified token's answer is reused (0–300, default 60). */
export const EVENT_AUTH_CACHE_ENV = 'CAPTF_EVENT_AUTH_CACHE_SECONDS';
/** Default of {@link EVENT_AUTH_CACHE_ENV}, in seconds: Knative's tokens live an hour and are resent until 5 min before expiry. */
export const DEFAULT_EVENT_AUTH_CACHE_SECONDS = 60;
/** Largest {@link EVENT_AUTH_CACHE_ENV}: how long a sender's removed ServiceAccount may still be trusted. */
export const MAX_EVENT_AUTH_CACHE_SECONDS = 300;
/** Tokens whose answers the cache holds at most (one per Trigger and source, in practice). */
export const EVENT_AUTH_CACHE_ENTRIES = 1000;

/** How a function checks the senders of its events. */
export type EventAuthConfig =
  | { mode: 'off' }
  | {
      mode: 'oidc';
      /** The audience of the function's Triggers (`spec.subscriber.audience`). */
      audience: string;
      /** Subjects (`system:serviceaccount:<ns>:<name>`) that may send; a trailing `*` is a prefix. */
      senders: string[];
      /** How long a verified token's answer is reused, in ms. */
      cacheTtlMs: number;
    };

/** An audience: 1–253 letters, digits or `. - _ : /` (Knative's `<group>/<kind>/<ns>/<name>` fits). */
const AUDIENCE = /^[A-Za-z0-9._:/-]{1,253}$/;
/** A subject or a prefix of one (`*` last only), as EventPolicy's `spec.from[].sub` takes it. */
const SUBJECT = /^[A-Za-z0-9._:@-]{1,316}\*?$/;

/**
 * Reads the sender check from the environment. `oidc` (the default: fail closed) needs an
 * audience and at least one sender; `off` accepts every delivery, which the function says
 * loudly at start.
 * @throws Error naming the variable when a value is missing or malformed.
 */
export function eventAuthFromEnv(env: NodeJS.ProcessEnv): EventAuthConfig {
  const mode = env[EVENT_AUTH_ENV]?.trim() || 'oidc';
  if (mode === 'off') return { mode };
  if (mode !== 'oidc') throw new Error(`${EVENT_AUTH_ENV}=${mode.slice(0, 40)} must be oidc or off`);
  return { mode, audience: audienceFrom(env), senders: sendersFrom(env), cacheTtlMs: cacheTtlFrom(env) };
}

/** {@link EVENT_AUDIENCE_ENV}, required. @throws Error naming it. */
function audienceFrom(env: NodeJS.ProcessEnv): string {
  const audience = env[EVENT_AUDIENCE_ENV]?.trim() ?? '';
  if (!AUDIENCE.test(audience))
    throw new Error(
      `${EVENT_AUTH_ENV}=oidc needs ${EVENT_AUDIENCE_ENV}: the audience its Triggers set (1–253 letters, digits or . - _ : /)`,
    );
  return audience;
}

/** {@link EVENT_SENDERS_ENV}: at least one subject, none that is only `*`. @throws Error naming it. */
function sendersFrom(env: NodeJS.ProcessEnv): string[] {
  const senders = (env[EVENT_SENDERS_ENV] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (senders.length === 0)
    throw new Error(
      `${EVENT_AUTH_ENV}=oidc needs ${EVENT_SENDERS_ENV}: the subjects of its Triggers' OIDC ServiceAccounts, comma-separated`,
    );
  const bad = senders.find((s) => !SUBJECT.test(s) || s === '*');
  if (bad)
    throw new Error(`${EVENT_SENDERS_ENV} has ${bad.slice(0, 80)}: not a subject (a trailing * only, after a prefix)`);
  return senders;
}

/** {@link EVENT_AUTH_CACHE_ENV} in ms (whole seconds 0–300, default 60). @throws Error naming it. */
function cacheTtlFrom(env: NodeJS.ProcessEnv): number {
  const raw = env[EVENT_AUTH_CACHE_ENV]?.trim() || String(DEFAULT_EVENT_AUTH_CACHE_SECONDS);
  const seconds = Number(raw);
  if (!Number.isInteger(seconds) || seconds < 0 || seconds > MAX_EVENT_AUTH_CACHE_SECONDS)
    throw new Error(`${EVENT_AUTH_CACHE_ENV}=${raw} must be an integer from 0 to ${MAX_EVENT_AUTH_CACHE_SECONDS}`);
  return seconds * 1000;
}

/**
 * Whether `subject` matches one of `senders`: equal, or starting with what precedes a trailing
 * `*` (knative/eventing `pkg/auth/event_policy.go` SubjectContained).
 */
export function isSender(subject: string, senders: readonly string[]): boolean {
  return senders.some((s) => (s.endsWith('*') ? subject.startsWith(s.slice(0, -1)) : subject === s));
}

/**
 * What a Knative audience names, `<group>/<kind>/<namespace>/<name>` (knative/eventing
 * `pkg/auth/audience.go`): the object an EventPolicy must target to apply to this function.
 */
export interface PolicyTarget {
  group: string;
  kind: string;
  namespace: string;
  name: string;
}

/** The target an audience names, or undefined when it is not Knative's four parts. */
export function targetOfAudience(audience: string): PolicyTarget | undefined {
  const parts = audience.split('/');
  // A group has dots and no slash; "" is the core group, which no Knative audience names.
  if (parts.length !== 4 || parts.some((p) => p === '')) return undefined;
  const [group, kind, namespace, name] = parts as [string, string, string, string];
  return { group, kind, namespace, name };
}

/** The parts of an `eventing.knative.dev/v1alpha1` EventPolicy this module reads. */
export interface EventPolicyLike {
  metadata?: { name?: string; namespace?: string };
  spec?: {
    to?: { ref?: { apiVersion?: string; kind?: string; name?: string }; selector?: unknown }[] | null;
    filters?: unknown[] | null;
  };
  status?: { from?: string[] | null; conditions?: { type?: string; status?: string }[] | null };
}

/** Why an EventPolicy that applies to the function adds no sender. */
export type PolicySkip = 'not-ready' | 'has-filters';

/**
 * The senders EventPolicies add for `target` (SPEC §12), by Knative's rules
 * (knative/eventing `pkg/auth/event_policy.go` GetEventPoliciesForResource, and the
 * verifier's use of `status.from`): a policy in the target's namespace applies when its
 * `spec.to` is empty, or names the target by `ref` (name, API group and kind compared without
 * case); its senders are `status.from`, the subjects Eventing resolved from `spec.from`, and
 * only once the policy is Ready. Two cases fail closed, adding nobody: a policy that picks
 * its targets by label `selector` is never taken to apply (the function does not read its
 * own labels), and one with `spec.filters` (judged on the event, whose body is read only
 * after the sender is known).
 * @returns the subjects (a trailing `*` is a prefix, as {@link isSender} takes them) and the
 *   applying policies that added none, by name, for the log.
 */
export function policySenders(
  policies: readonly EventPolicyLike[],
  target: PolicyTarget,
): { senders: string[]; skipped: { name: string; why: PolicySkip }[] } {
  const senders: string[] = [];
  const skipped: { name: string; why: PolicySkip }[] = [];
  for (const p of policies.filter((p) => applies(p, target))) {
    const why = skipFor(p);
    if (why) skipped.push({ name: p.metadata?.name ?? '', why });
    else senders.push(...(p.status?.from ?? []).filter((s) => SUBJECT.test(s) && s !== '*'));
  }
  return { senders, skipped };
}

/** Why an applying policy adds nobody: it has filters, or is not Ready. */
function skipFor(p: EventPolicyLike): PolicySkip | undefined {
  if ((p.spec?.filters ?? []).length > 0) return 'has-filters';
  return isReady(p) ? undefined : 'not-ready';
}

/** Whether `p` lives in `target`'s namespace and its `spec.to` takes `target` in (empty: every object there). */
function applies(p: EventPolicyLike, target: PolicyTarget): boolean {
  if (!same(p.metadata?.namespace ?? target.namespace, target.namespace)) return false;
  const to = p.spec?.to ?? [];
  if (to.length === 0) return true;
  return to.some(
    ({ ref }) =>
      ref !== undefined &&
      same(ref.name, target.name) &&
      same(ref.kind, target.kind) &&
      same(groupOf(ref.apiVersion ?? ''), target.group),
  );
}

const same = (a: string | undefined, b: string): boolean => a !== undefined && a.toLowerCase() === b.toLowerCase();
/** The group of an apiVersion (`serving.knative.dev/v1` → `serving.knative.dev`; `v1` → ``). */
const groupOf = (apiVersion: string): string => (apiVersion.includes('/') ? apiVersion.split('/')[0]! : '');
const isReady = (p: EventPolicyLike): boolean =>
  (p.status?.conditions ?? []).some((c) => c.type === 'Ready' && c.status === 'True');

/** Why a delivery was refused: no Bearer token, one the API server did not authenticate for the audience, or a subject that is no sender. */
export type SenderRefusal = 'no-token' | 'invalid-token' | 'not-a-sender';

/**
 * The answer to a refused delivery: 401 (with a challenge) or 403, and a body that says only
 * what is missing, never the token, the subject or anything about the function's work.
 */
export function refusal(why: SenderRefusal): { status: 401 | 403; body: { error: string }; challenge?: string } {
  if (why === 'not-a-sender') return { status: 403, body: { error: 'this sender may not deliver events here' } };
  return {
    status: 401,
    body: { error: 'a delivery needs a valid Bearer token for this function' },
    challenge: why === 'no-token' ? 'Bearer' : 'Bearer error="invalid_token"',
  };
}

/** The start-up warning of a function whose sender check is off (SPEC §12). */
export const OFF_WARNING =
  `event sender verification is off (${EVENT_AUTH_ENV}=off): anyone who reaches this function can send it events; ` +
  `turn on Knative's authentication-oidc and set ${EVENT_AUTH_ENV}=oidc (docs/deploy-knative.md)`;

/** Longest Kubernetes object name Knative's `kmeta.ChildName` makes (a DNS label). */
const LONGEST_NAME = 63;
/** Hex digits of an MD5 sum. */
const MD5_HEX = 32;

/**
 * The name of the OIDC ServiceAccount Knative Eventing makes for an object of `kind` in `group`
 * (knative/eventing `pkg/auth/serviceaccount.go` GetOIDCServiceAccountNameForResource, with
 * knative/pkg `kmeta.ChildName`): `<name>-oidc-<group>-<kind>` lowercased, hashed with MD5 to
 * fit 63 characters when longer. A Trigger's deliveries are signed as this ServiceAccount.
 */
export function oidcServiceAccountName(name: string, kind = 'Trigger', group = 'eventing.knative.dev'): string {
  const suffix = `-oidc-${group}-${kind}`;
  const head = LONGEST_NAME - MD5_HEX;
  if (name.length <= LONGEST_NAME - suffix.length) return `${name}${suffix}`.toLowerCase();
  if (head - suffix.length > 0) return `${name.slice(0, head - suffix.length)}${md5(name)}${suffix}`.toLowerCase();
  let n = `${name.slice(0, head)}${md5(name + suffix)}`;
  if (n.length < LONGEST_NAME) n += suffix.slice(0, LONGEST_NAME - n.length);
  return n.replace(/[^a-zA-Z0-9]+$/, '').toLowerCase();
}

const md5 = (s: string): string => createHash('md5').update(s).digest('hex');
