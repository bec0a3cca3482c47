/**
 * AdmissionReview `admission.k8s.io/v1` in and out (Kubernetes "Dynamic Admission Control":
 * the webhook answers the same apiVersion/kind with `response.uid` = `request.uid`). Pure:
 * text in, a parsed request or a reason to refuse out; a decision in, a review out.
 */
import type { Decision, IdentityRequest, UserInfo } from './decide.ts';
import { isDns1123Subdomain } from '../lib/allowed-namespaces.ts';

/** The only AdmissionReview version this webhook speaks (register it with `admissionReviewVersions: [v1]`). */
export const ADMISSION_API_VERSION = 'admission.k8s.io/v1';

/**
 * Deepest nesting of objects and arrays a review may have. A real one is about 15 levels deep
 * (the object's `managedFields` are the deepest part); a body nested thousands of levels deep
 * would overflow the stack of any recursive walk over it (deep equality of the two specs,
 * `JSON.stringify` of a bad value in a message), so it is refused before anything reads it.
 */
export const MAX_REVIEW_NESTING = 100;

/** Does `value` nest objects and arrays deeper than `max` levels? Iterative, so any depth is safe. */
export function nestsDeeperThan(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (typeof v !== 'object' || v === null) continue;
    if (depth > max) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v as object)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1]);
    }
  }
  return false;
}

/** Result of reading a posted body. */
export type ParsedReview =
  | { ok: true; request: IdentityRequest }
  /** Cannot be answered with a review (no uid to echo, not a v1 AdmissionReview): HTTP 400. */
  | { ok: false; httpStatus: 400; error: string }
  /** Has a uid but is unusable (e.g. no userInfo): answer a denial echoing `uid`. */
  | { ok: false; uid: string; decision: Decision & { allowed: false } };

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const bad = (error: string): ParsedReview => ({ ok: false, httpStatus: 400, error });

function isStringArray(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((x) => typeof x === 'string');
}

const isSet = (v: unknown): boolean => v !== undefined && v !== null;
const refused = (error: string): { refused: ParsedReview } => ({ refused: bad(error) });

/** Validates `userInfo.extra`; returns the error or the map (empty when absent). */
function readExtra(v: unknown): Record<string, string[]> | string {
  if (!isSet(v)) return {};
  if (!isPlainObject(v)) return 'request.userInfo.extra must be a map of string lists';
  for (const [k, vals] of Object.entries(v))
    if (!isStringArray(vals))
      return `request.userInfo.extra[${JSON.stringify(k.slice(0, 80))}] must be a list of strings`;
  // fromEntries defines own properties: a key such as `__proto__` stays a key and reaches the SubjectAccessReview.
  return Object.fromEntries(Object.entries(v) as [string, string[]][]);
}

/** The first problem with `userInfo`'s fields other than `extra`, or undefined. */
function userInfoError(v: Record<string, unknown>): string | undefined {
  if (typeof v.username !== 'string' || v.username === '') return 'request.userInfo.username is missing';
  if (isSet(v.groups) && !isStringArray(v.groups)) return 'request.userInfo.groups must be a list of strings';
  if (isSet(v.uid) && typeof v.uid !== 'string') return 'request.userInfo.uid must be a string';
  return undefined;
}

/** Validates `request.userInfo`; returns the error or the typed value. */
function readUserInfo(v: unknown): UserInfo | string {
  if (!isPlainObject(v)) return 'request.userInfo is missing';
  const error = userInfoError(v);
  if (error) return error;
  const extra = readExtra(v.extra);
  if (typeof extra === 'string') return extra;
  return {
    username: v.username as string,
    ...(typeof v.uid === 'string' && v.uid ? { uid: v.uid } : {}),
    ...(isStringArray(v.groups) ? { groups: v.groups } : {}),
    ...(Object.keys(extra).length > 0 ? { extra } : {}),
  };
}

/**
 * A field's value for a message: a string quoted (at most 100 characters), anything else by
 * its type only (`String()` of a deeply nested array would overflow the stack).
 */
function shown(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v.slice(0, 100));
  if (v === undefined || v === null) return '""';
  return `(${Array.isArray(v) ? 'array' : typeof v})`;
}

/** Reads the body as an `admission.k8s.io/v1` AdmissionReview; returns its `request` or a 400. */
function readReviewRequest(body: unknown): { request: Record<string, unknown> } | { refused: ParsedReview } {
  if (typeof body !== 'string' || body.trim() === '')
    return refused('request body is empty; expected an AdmissionReview (admission.k8s.io/v1) as JSON');
  let doc: unknown;
  try {
    doc = JSON.parse(body);
  } catch {
    return refused('request body is not JSON; expected an AdmissionReview (admission.k8s.io/v1)');
  }
  if (!isPlainObject(doc)) return refused('request body is not a JSON object; expected an AdmissionReview');
  if (doc.apiVersion !== ADMISSION_API_VERSION || doc.kind !== 'AdmissionReview') {
    const got = `${shown(doc.apiVersion)} ${shown(doc.kind)}`;
    return refused(
      `expected apiVersion ${ADMISSION_API_VERSION} and kind AdmissionReview, got ${got}; register the webhook with admissionReviewVersions: [v1]`,
    );
  }
  if (!isPlainObject(doc.request)) return refused('AdmissionReview has no request');
  return { request: doc.request };
}

/** The optional fields of a request that were set, typed. */
function optionalRequestFields(req: Record<string, unknown>): Partial<IdentityRequest> {
  return {
    ...(typeof req.subResource === 'string' && req.subResource ? { subResource: req.subResource } : {}),
    ...(typeof req.name === 'string' && req.name ? { name: req.name } : {}),
    ...(isSet(req.object) ? { object: req.object } : {}),
    ...(isSet(req.oldObject) ? { oldObject: req.oldObject } : {}),
    ...(req.dryRun === true ? { dryRun: true } : {}),
  };
}

/**
 * Parses a posted AdmissionReview.
 * @param body the raw request body (text).
 * @returns `ok` with the request; or 400 with a message when it is not JSON, not an
 *   `admission.k8s.io/v1` AdmissionReview, has no `request` or no `request.uid`; or a
 *   denial echoing the uid when `operation` or `userInfo` is missing or malformed, or
 *   `name` is not an object name (fail closed).
 *   Messages never quote the body.
 */
export function parseReview(body: unknown): ParsedReview {
  const read = readReviewRequest(body);
  if ('refused' in read) return read.refused;
  const req = read.request;
  if (typeof req.uid !== 'string' || req.uid === '') return bad('AdmissionReview request has no uid to answer');
  const uid = req.uid;
  const refuse = (message: string): ParsedReview => ({
    ok: false,
    uid,
    decision: {
      allowed: false,
      code: 400,
      reason: 'BadRequest',
      message: `malformed AdmissionReview, denied: ${message}`,
    },
  });
  if (nestsDeeperThan(req, MAX_REVIEW_NESTING - 1))
    return refuse(`the review nests objects and arrays more than ${MAX_REVIEW_NESTING} levels deep`);
  if (typeof req.operation !== 'string' || req.operation === '') return refuse('request.operation is missing');
  const userInfo = readUserInfo(req.userInfo);
  if (typeof userInfo === 'string') return refuse(userInfo);
  if (!namedAsTheApiServerNames(req.name))
    return refuse('request.name is not an object name (a DNS-1123 subdomain of at most 253 characters)');
  return { ok: true, request: { uid, operation: req.operation, userInfo, ...optionalRequestFields(req) } };
}

/**
 * Whether `name` (a request's `name`) is absent or an object name: the API server only names
 * objects this way, so anything else never came from it, and is not carried into lookups,
 * messages or logs.
 */
const namedAsTheApiServerNames = (name: unknown): boolean =>
  typeof name !== 'string' || name === '' || isDns1123Subdomain(name);

/** An `admission.k8s.io/v1` AdmissionReview answer. */
export interface AdmissionReviewResponse {
  apiVersion: typeof ADMISSION_API_VERSION;
  kind: 'AdmissionReview';
  response: {
    uid: string;
    allowed: boolean;
    status?: { code: number; reason: string; message: string };
    /** Shown by kubectl as `Warning:` lines; only on allowed answers that have some. */
    warnings?: string[];
  };
}

/**
 * Builds the answer to one review.
 * @param uid `request.uid`, echoed as the API server requires.
 * @param decision allowed (with its `warnings`, SPEC §10, passed on when there are any), or
 *   denied with code/reason/message (shown to the user by the API server).
 */
export function reviewResponse(uid: string, decision: Decision): AdmissionReviewResponse {
  return {
    apiVersion: ADMISSION_API_VERSION,
    kind: 'AdmissionReview',
    response: decision.allowed
      ? { uid, allowed: true, ...(decision.warnings?.length ? { warnings: [...decision.warnings] } : {}) }
      : { uid, allowed: false, status: { code: decision.code, reason: decision.reason, message: decision.message } },
  };
}
