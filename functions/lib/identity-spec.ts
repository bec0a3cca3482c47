/**
 * SPEC §1/§2/§10: is a TerraformClusterIdentity `spec` acceptable? Pure; used by admission
 * before any SubjectAccessReview so a malformed identity is refused for what it is.
 */
import { isDns1123Label, isDns1123Subdomain, quote, validateAllowedNamespaces } from './allowed-namespaces.ts';

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * Validates an identity's `spec`.
 * @param spec `object.spec` of the identity, any shape.
 * @returns one message per problem, each naming the field and the bad value
 *   (`spec.secretRef.name: "Bad_Name" is not a valid Secret name …`); empty when valid.
 *   Checks: `secretRef.name` is a DNS-1123 subdomain (Secret names), `secretRef.namespace` is
 *   a DNS-1123 label (namespace names), and `allowedNamespaces` is one of the SPEC §2 forms.
 */
export function validateIdentitySpec(spec: unknown): string[] {
  if (!isPlainObject(spec)) return ['spec: must be an object with secretRef (and optionally allowedNamespaces)'];
  return [...secretRefErrors(spec.secretRef), ...validateAllowedNamespaces(spec.allowedNamespaces)];
}

const isEmpty = (v: unknown): boolean => v === undefined || v === null || v === '';

function secretRefErrors(ref: unknown): string[] {
  if (!isPlainObject(ref)) return ['spec.secretRef: required, with name and namespace of the source Secret'];
  const errors: string[] = [];
  if (isEmpty(ref.name)) errors.push('spec.secretRef.name: required');
  else if (!isDns1123Subdomain(ref.name)) {
    errors.push(
      `spec.secretRef.name: ${quote(ref.name)} is not a valid Secret name (lower-case DNS-1123 subdomain, at most 253 characters)`,
    );
  }
  if (isEmpty(ref.namespace)) errors.push('spec.secretRef.namespace: required');
  else if (!isDns1123Label(ref.namespace)) {
    errors.push(
      `spec.secretRef.namespace: ${quote(ref.namespace)} is not a valid namespace name (lower-case DNS-1123 label, at most 63 characters)`,
    );
  }
  return errors;
}
