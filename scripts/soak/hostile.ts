/**
 * Hostile input for the functions' HTTP endpoints, as fast-check
 * arbitraries: AdmissionReviews and CloudEvents (binary, structured and batch mode) with
 * missing and wrong attributes, wrong types, huge strings, deep nesting, invalid UTF-8, wrong
 * content types and empty bodies; and well-formed events about objects that do not exist.
 * Bodies are built as bytes: a value tree may hold {@link Raw} fragments (a 200 000-deep
 * array, a megabyte string, bytes that are not UTF-8) that are spliced in verbatim, since
 * such values cannot be made by `JSON.stringify`.
 */
import fc from 'fast-check';
import { API_VERSION, IDENTITY_KIND } from '../../functions/lib/api.ts';

/** Bytes put into a body verbatim, where a JSON value would go. */
export class Raw {
  readonly bytes: Buffer;
  readonly label: string;
  constructor(bytes: Buffer | string, label: string) {
    this.bytes = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes, 'utf8');
    this.label = label;
  }
  /** How fast-check prints a counterexample: the label, never a megabyte. */
  toString(): string {
    return `Raw(${this.label})`;
  }
  [fc.toStringMethod](): string {
    return this.toString();
  }
}

/** One HTTP request to a function. */
export interface HostileRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Raw | unknown;
}

/** What a case expects: `ok` a 2xx, `no-5xx` anything but a 5xx or a dropped connection. */
export interface FuzzCase {
  kind: string;
  expect: 'ok' | 'no-5xx';
  request: HostileRequest;
}

/** Serialises a value tree (which may hold {@link Raw} fragments) to bytes. */
export function encode(value: unknown): Buffer {
  if (value instanceof Raw) return value.bytes;
  if (value === undefined) return Buffer.alloc(0);
  const parts: Buffer[] = [];
  write(value, parts);
  return Buffer.concat(parts);
}

function write(v: unknown, out: Buffer[]): void {
  if (v instanceof Raw) out.push(v.bytes);
  else if (Array.isArray(v)) writeList(v, out);
  else if (typeof v === 'object' && v !== null) writeObject(v as Record<string, unknown>, out);
  else out.push(Buffer.from(JSON.stringify(v) ?? 'null'));
}

function writeList(list: unknown[], out: Buffer[]): void {
  out.push(Buffer.from('['));
  list.forEach((item, i) => {
    if (i) out.push(Buffer.from(','));
    write(item === undefined ? null : item, out);
  });
  out.push(Buffer.from(']'));
}

function writeObject(o: Record<string, unknown>, out: Buffer[]): void {
  out.push(Buffer.from('{'));
  let first = true;
  for (const [k, v] of Object.entries(o)) {
    if (v === undefined) continue;
    out.push(Buffer.from(`${first ? '' : ','}${JSON.stringify(k)}:`));
    write(v, out);
    first = false;
  }
  out.push(Buffer.from('}'));
}

/** Depths and sizes of the extreme fragments (a body stays under the 3 MiB limit). */
const DEPTHS = [64, 2_000, 10_000, 200_000] as const;
const SIZES = [1_000, 100_000, 1_000_000] as const;

/** Byte sequences that are not UTF-8: a lone continuation byte, overlong, surrogate, 0xFF, truncated. */
const INVALID_UTF8 = [[0x80], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xff, 0xfe], [0xe2, 0x82], [0xf4, 0x90, 0x80, 0x80]];

/** A deeply nested array or object, e.g. `[[[…]]]` or `{"a":{"a":…}}`. */
const deep = fc
  .tuple(fc.constantFrom(...DEPTHS), fc.boolean())
  .map(([d, arr]) =>
    arr
      ? new Raw('['.repeat(d) + ']'.repeat(d), `[]×${d}`)
      : new Raw('{"a":'.repeat(d) + '1' + '}'.repeat(d), `{a:}×${d}`),
  );

/** A very long string. */
const huge = fc.tuple(fc.constantFrom(...SIZES), fc.constantFrom('a', 'é', '\\u0000', '"')).map(([n, c]) => {
  const unit = c === '"' ? '\\"' : c;
  return new Raw(`"${unit.repeat(Math.floor(n / Buffer.byteLength(unit)))}"`, `${n} bytes of ${c}`);
});

/** A JSON string holding bytes that are not UTF-8. */
const notUtf8 = fc
  .tuple(fc.string({ maxLength: 8 }), fc.constantFrom(...INVALID_UTF8), fc.string({ maxLength: 8 }))
  .map(
    ([a, bad, b]) =>
      new Raw(
        Buffer.concat([
          Buffer.from(JSON.stringify(a).slice(0, -1)),
          Buffer.from(bad),
          Buffer.from(JSON.stringify(b).slice(1)),
        ]),
        `not UTF-8 ${Buffer.from(bad).toString('hex')}`,
      ),
  );

/** JSON that is odd but valid: lone surrogates, huge numbers, duplicate keys, `__proto__`. */
const oddJson = fc.constantFrom(
  new Raw('"\\ud800"', 'lone surrogate'),
  new Raw('1e999', '1e999'),
  new Raw('-0', '-0'),
  new Raw('123456789012345678901234567890', 'bigint'),
  new Raw('{"a":1,"a":{"b":2}}', 'duplicate keys'),
  new Raw('{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}}}', '__proto__'),
);

/** Any value a field might wrongly hold: every JSON type, and the extreme fragments. */
export const weird: fc.Arbitrary<unknown> = fc.oneof(
  { arbitrary: fc.jsonValue({ maxDepth: 3 }), weight: 6 },
  {
    arbitrary: fc.constantFrom(null, true, false, 0, -1, 1.5, '', ' ', '..', '../kube-system', 'UPPER', 'a,b', 'a=b'),
    weight: 4,
  },
  { arbitrary: deep, weight: 1 },
  { arbitrary: huge, weight: 1 },
  { arbitrary: notUtf8, weight: 1 },
  { arbitrary: oddJson, weight: 1 },
);

/** A whole body that is not a JSON document of the right shape. */
export const garbageBody: fc.Arbitrary<Raw> = fc.oneof(
  fc.constantFrom(
    new Raw('', 'empty'),
    new Raw(' \n\t', 'whitespace'),
    new Raw('null', 'null'),
    new Raw('[]', '[]'),
    new Raw('"just a string"', 'string'),
    new Raw('{"truncated":', 'truncated'),
    new Raw('\uFEFF{}', 'BOM'),
  ),
  fc.uint8Array({ maxLength: 512 }).map((b) => new Raw(Buffer.from(b), `${b.length} random bytes`)),
  fc.string({ maxLength: 200 }).map((s) => new Raw(s, `text ${JSON.stringify(s.slice(0, 20))}`)),
  deep,
  huge,
  notUtf8,
);

/** Content types, right and wrong (charsets Node cannot decode, multipart, none at all). */
export const contentType = fc.constantFrom(
  undefined,
  'application/json',
  'application/json; charset=utf-8',
  'APPLICATION/JSON',
  'text/plain',
  'text/plain; charset=latin1',
  'application/json; charset=utf-16',
  'application/json; charset=bogus-8',
  'application/x-www-form-urlencoded',
  'multipart/form-data; boundary=xyz',
  'application/cloudevents+json',
  'application/cloudevents+json; charset=utf-8',
  'application/cloudevents-batch+json',
  'application/octet-stream',
  '*/*',
  ';;;',
);

/** A Kubernetes-valid name that no object has (so events about it name nothing). */
export const absentName = fc
  .tuple(fc.constantFrom('fz', 'fuzz-nx'), fc.stringMatching(/^[a-z0-9]{6,12}$/))
  .map(([p, s]) => `${p}-${s}`);

/** Sets or deletes the value at `path` in a copy of a plain JSON tree. */
export function mutate(tree: unknown, path: readonly string[], value: unknown, remove: boolean): unknown {
  if (path.length === 0) return remove ? undefined : value;
  const base =
    typeof tree === 'object' && tree !== null && !(tree instanceof Raw) ? (tree as Record<string, unknown>) : {};
  const copy: Record<string, unknown> = Array.isArray(base) ? ([...base] as never) : { ...base };
  const [head, ...rest] = path as [string, ...string[]];
  const next = mutate(copy[head], rest, value, remove);
  if (next === undefined) delete copy[head];
  else copy[head] = next;
  return copy;
}

/** A list of mutations (delete, or set to a {@link weird} value) over the given paths. */
export function mutations(paths: readonly (readonly string[])[], max = 4) {
  return fc.array(fc.tuple(fc.constantFrom(...paths), weird, fc.boolean()), { minLength: 1, maxLength: max });
}

/** Applies {@link mutations} to a tree. */
export function applyAll(tree: unknown, list: readonly (readonly [readonly string[], unknown, boolean])[]): unknown {
  return list.reduce((t, [path, value, remove]) => mutate(t, path, value, remove), tree);
}

// ---------------------------------------------------------------------------------------
// AdmissionReviews

const SPEC_PATHS = [
  ['spec'],
  ['spec', 'secretRef'],
  ['spec', 'secretRef', 'name'],
  ['spec', 'secretRef', 'namespace'],
  ['spec', 'allowedNamespaces'],
  ['spec', 'allowedNamespaces', 'list'],
  ['spec', 'allowedNamespaces', 'selector'],
  ['spec', 'allowedNamespaces', 'selector', 'matchLabels'],
  ['spec', 'allowedNamespaces', 'selector', 'matchExpressions'],
  ['metadata'],
  ['metadata', 'name'],
] as const;

/** Paths of an AdmissionReview a mutation may hit. */
export const REVIEW_PATHS: readonly (readonly string[])[] = [
  ['apiVersion'],
  ['kind'],
  ['request'],
  ['request', 'uid'],
  ['request', 'operation'],
  ['request', 'name'],
  ['request', 'subResource'],
  ['request', 'dryRun'],
  ['request', 'userInfo'],
  ['request', 'userInfo', 'username'],
  ['request', 'userInfo', 'groups'],
  ['request', 'userInfo', 'uid'],
  ['request', 'userInfo', 'extra'],
  ['request', 'object'],
  ['request', 'oldObject'],
  ...SPEC_PATHS.map((p) => ['request', 'object', ...p]),
  ...SPEC_PATHS.map((p) => ['request', 'oldObject', ...p]),
];

const allowedNamespaces = fc.oneof(
  fc.constant(undefined),
  fc.record({ list: fc.array(absentName, { maxLength: 3 }) }),
  fc.constant({ selector: {} }),
  fc.record({
    selector: fc.record({ matchLabels: fc.dictionary(fc.constantFrom('env', 'tier'), fc.constantFrom('a', 'b')) }),
  }),
);

const identity = fc.tuple(absentName, absentName, allowedNamespaces).map(([name, secret, allowed]) => ({
  apiVersion: API_VERSION,
  kind: IDENTITY_KIND,
  metadata: { name },
  spec: {
    secretRef: { name: secret, namespace: 'captf-fuzz-secrets' },
    ...(allowed ? { allowedNamespaces: allowed } : {}),
  },
}));

/** A well-formed AdmissionReview v1 for an identity (its user may or may not read the Secret). */
export const goodReview = fc
  .tuple(fc.uuid(), fc.constantFrom('CREATE', 'UPDATE', 'DELETE'), identity, identity, fc.boolean())
  .map(([uid, operation, object, oldObject, dryRun]) => ({
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid,
      operation,
      name: object.metadata.name,
      userInfo: { username: `fuzz-user-${uid.slice(0, 8)}`, groups: ['fuzzers'] },
      ...(operation === 'DELETE' ? {} : { object }),
      ...(operation === 'CREATE'
        ? {}
        : { oldObject: operation === 'DELETE' ? object : { ...oldObject, metadata: object.metadata } }),
      ...(dryRun ? { dryRun } : {}),
    },
  }));

/** Headers of a POST with an optional content type. */
const headersFor = (type: string | undefined): Record<string, string> => (type ? { 'content-type': type } : {});

/** Hostile AdmissionReviews: mutated good ones, garbage bodies, wrong content types, other methods. */
export const hostileReview: fc.Arbitrary<FuzzCase> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc
      .tuple(goodReview, mutations(REVIEW_PATHS), contentType)
      .map(([r, m, type]) => review(applyAll(r, m), type, 'mutated review')),
  },
  {
    weight: 2,
    arbitrary: fc
      .tuple(goodReview, mutations(SPEC_PATHS))
      .map(([r, m]) => review(sameInBoth(r, m), 'application/json', 'update, same change in old and new')),
  },
  { weight: 2, arbitrary: fc.tuple(garbageBody, contentType).map(([b, type]) => review(b, type, 'garbage')) },
  {
    weight: 1,
    arbitrary: fc.tuple(goodReview, fc.constantFrom('GET', 'PUT', 'DELETE', 'PATCH', 'OPTIONS')).map(([r, method]) => ({
      ...review(r, 'application/json', 'method'),
      request: { method, path: '/validate', headers: {}, body: r },
    })),
  },
);

/** An UPDATE whose object and oldObject got the same mutations (as the API server sends an unchanged field). */
function sameInBoth(r: { request: Record<string, unknown> }, m: Parameters<typeof applyAll>[1]): unknown {
  const object = applyAll(r.request.object ?? r.request.oldObject, m);
  return { ...r, request: { ...r.request, operation: 'UPDATE', object, oldObject: object } };
}

function review(body: unknown, type: string | undefined, kind: string): FuzzCase {
  return { kind, expect: 'no-5xx', request: { method: 'POST', path: '/validate', headers: headersFor(type), body } };
}

/** A metadata-only UPDATE (answered without an API call): the known-good request between cases. */
export function knownGoodReview(uid: string): HostileRequest {
  const obj = {
    apiVersion: API_VERSION,
    kind: IDENTITY_KIND,
    metadata: { name: 'fz-good' },
    spec: { secretRef: { name: 's', namespace: 'n' } },
  };
  return {
    method: 'POST',
    path: '/validate',
    headers: { 'content-type': 'application/json' },
    body: {
      apiVersion: 'admission.k8s.io/v1',
      kind: 'AdmissionReview',
      request: {
        uid,
        operation: 'UPDATE',
        name: 'fz-good',
        userInfo: { username: 'fuzz' },
        object: { ...obj, metadata: { name: 'fz-good', labels: { a: 'b' } } },
        oldObject: obj,
      },
    },
  };
}
