/**
 * Who may ask admission for a review (functions/admission/callers.ts) and the configuration
 * that turns the check on (functions/admission/index.ts `admissionConfigFromEnv`): the pure
 * decision over what the TLS layer verified, and the settings that would make it meaningless.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { decideCaller, type Peer } from '../../functions/admission/callers.ts';
import { admissionConfigFromEnv } from '../../functions/admission/index.ts';

const peer = (over: Partial<Peer> = {}): Peer => ({
  authorized: true,
  presented: true,
  commonNames: ['kube-apiserver-webhook-client'],
  ...over,
});

describe('decideCaller', () => {
  it('admits a verified certificate when no names are configured', () => {
    assert.equal(decideCaller(peer({ commonNames: ['anything'] }), []), undefined);
  });
  it('admits a verified certificate whose one CN is one of the names; several CNs are refused', () => {
    assert.equal(decideCaller(peer({ commonNames: ['apiserver'] }), ['other', 'apiserver']), undefined);
    assert.equal(decideCaller(peer({ commonNames: ['x', 'apiserver'] }), ['apiserver']), 'subject not allowed');
  });
  it('refuses a caller with no certificate, even one the TLS layer called authorized', () => {
    assert.equal(decideCaller(peer({ presented: false, authorized: true }), []), 'no client certificate');
  });
  it('refuses a certificate that did not verify against the CA', () => {
    const p = peer({ authorized: false, authorizationError: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' });
    assert.equal(decideCaller(p, []), 'not signed by the client CA');
    assert.equal(decideCaller(p, ['kube-apiserver-webhook-client']), 'not signed by the client CA');
  });
  it('refuses a verified certificate with another CN, and one with no CN, when names are set', () => {
    assert.equal(decideCaller(peer({ commonNames: ['alice'] }), ['apiserver']), 'subject not allowed');
    assert.equal(decideCaller(peer({ commonNames: [] }), ['apiserver']), 'subject not allowed');
  });
});

describe('admissionConfigFromEnv: the caller check', () => {
  it('is off unless a CA file is named; names are trimmed and blanks dropped', () => {
    assert.equal(admissionConfigFromEnv({}).caFile, undefined);
    const cfg = admissionConfigFromEnv({
      CAPTF_ADMISSION_CLIENT_CA_FILE: ' /ca.crt ',
      CAPTF_ADMISSION_CLIENT_NAMES: ' a , ,b',
    });
    assert.equal(cfg.caFile, '/ca.crt');
    assert.deepEqual(cfg.clientNames, ['a', 'b']);
  });
  it('refuses a variable set but blank: the check would be off (or any name admitted) without a word', () => {
    assert.throws(() => admissionConfigFromEnv({ CAPTF_ADMISSION_CLIENT_CA_FILE: ' ' }), /set but blank/);
    assert.throws(
      () => admissionConfigFromEnv({ CAPTF_ADMISSION_CLIENT_CA_FILE: '/ca.crt', CAPTF_ADMISSION_CLIENT_NAMES: ' , ' }),
      /names no subject/,
    );
  });
  it('refuses names without a CA, and a CA with plain HTTP (no certificate reaches the function)', () => {
    assert.throws(
      () => admissionConfigFromEnv({ CAPTF_ADMISSION_CLIENT_NAMES: 'a' }),
      /needs CAPTF_ADMISSION_CLIENT_CA_FILE/,
    );
    assert.throws(
      () => admissionConfigFromEnv({ CAPTF_ADMISSION_CLIENT_CA_FILE: '/ca.crt', CAPTF_ADMISSION_PLAIN_HTTP: 'true' }),
      /needs HTTPS/,
    );
  });
});
