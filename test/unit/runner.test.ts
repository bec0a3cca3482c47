import assert from 'node:assert/strict';
import { constants } from 'node:os';
import { describe, it } from 'node:test';
import {
  EXIT_NOT_EXECUTABLE,
  EXIT_NOT_FOUND,
  EXIT_RUNNER_FAILED,
  exitStatusForSpawnError,
  exitStatusOf,
  parseCommandLine,
} from '../../functions/runner/command-line.ts';
import { KEPT_NAMES, filterEnvironment, isRemoved } from '../../functions/runner/filter-env.ts';

describe('which variables captf-runner removes (SPEC §11)', () => {
  const table: [name: string, removed: boolean, why: string][] = [
    ['TF_VAR_region', true, 'TF_ prefix'],
    ['TF_LOG', true, 'TF_ prefix'],
    ['TF_CLI_ARGS_apply', true, 'TF_ prefix'],
    ['TF_', true, 'the bare prefix'],
    ['KUBE_CONFIG_PATH', true, 'KUBE_ prefix'],
    ['KUBE_', true, 'the bare prefix'],
    ['TF_IN_AUTOMATION', false, 'exception'],
    ['TF_INPUT', false, 'exception'],
    ['KUBE_NAMESPACE', false, 'exception'],
    ['tf_var_region', true, 'lower-case prefix'],
    ['Tf_Log', true, 'mixed-case prefix'],
    ['kube_config_path', true, 'lower-case prefix'],
    ['tf_input', true, 'exceptions are exact, upper-case names'],
    ['Kube_Namespace', true, 'exceptions are exact, upper-case names'],
    ['TF_INPUTS', true, 'only the exact exception is kept'],
    ['TF_VAR_a.b', true, 'not a POSIX identifier, still a TF_ name'],
    ['tf_creds.json', true, 'not a POSIX identifier, still a tf_ name'],
    ['TF', false, 'no underscore'],
    ['TFX_FOO', false, 'different prefix'],
    ['KUBECONFIG', false, 'no underscore after KUBE (the Job decides whether to set it)'],
    ['KUBE-CONFIG', false, 'dash is not the prefix separator'],
    ['MY_TF_VAR', false, 'prefix must be at the start'],
    ['AWS_ACCESS_KEY_ID', false, 'ordinary credential variable'],
    ['aws.key', false, 'not a POSIX identifier, no prefix'],
    ['1token', false, 'starts with a digit, no prefix'],
    ['my-key', false, 'dash, no prefix'],
    ['\u212AUBE_CONFIG', false, 'Kelvin sign (U+212A) folds to k only under Unicode rules: no ASCII prefix'],
    ['', false, 'empty name'],
  ];
  for (const [name, removed, why] of table) {
    it(`${removed ? 'removes' : 'keeps'} ${JSON.stringify(name)} (${why})`, () => {
      assert.equal(isRemoved(name), removed);
    });
  }

  it('splits an environment into the command environment and the sorted removed names, values untouched', () => {
    const { env, removed } = filterEnvironment({
      PATH: '/usr/bin',
      TF_LOG: 'TRACE',
      tf_var_x: 'v',
      TF_INPUT: '0',
      KUBE_NAMESPACE: 'team-a',
      AWS_SECRET_ACCESS_KEY: 'k',
      'aws.key': 'dotted',
      GONE: undefined,
    });
    assert.deepEqual(env, {
      PATH: '/usr/bin',
      TF_INPUT: '0',
      KUBE_NAMESPACE: 'team-a',
      AWS_SECRET_ACCESS_KEY: 'k',
      'aws.key': 'dotted',
    });
    assert.deepEqual(removed, ['TF_LOG', 'tf_var_x']);
  });

  it('keeps exactly the three names the Job sets itself', () => {
    assert.deepEqual([...KEPT_NAMES].sort(), ['KUBE_NAMESPACE', 'TF_INPUT', 'TF_IN_AUTOMATION']);
  });
});

describe('captf-runner command line', () => {
  const table: [argv: string[], expected: ReturnType<typeof parseCommandLine>][] = [
    [
      ['--', 'terraform', 'apply', '-auto-approve'],
      { kind: 'run', command: 'terraform', args: ['apply', '-auto-approve'] },
    ],
    [['--', 'sh', '-c', 'echo -- "$1"', '--'], { kind: 'run', command: 'sh', args: ['-c', 'echo -- "$1"', '--'] }],
    [['-h'], { kind: 'help' }],
    [['--help'], { kind: 'help' }],
    [[], { kind: 'usage-error', message: 'no command given' }],
    [['--'], { kind: 'usage-error', message: 'no command given after "--"' }],
    [['--', ''], { kind: 'usage-error', message: 'no command given after "--"' }],
    [['terraform', 'apply'], { kind: 'usage-error', message: 'expected "--" before the command, got "terraform"' }],
    [['--verbose', '--', 'x'], { kind: 'usage-error', message: 'expected "--" before the command, got "--verbose"' }],
  ];
  for (const [argv, expected] of table) {
    it(`parses ${JSON.stringify(argv)}`, () => assert.deepEqual(parseCommandLine(argv), expected));
  }
});

describe('captf-runner exit statuses', () => {
  it('passes the exit code through and maps a signal to 128 + its number', () => {
    assert.equal(exitStatusOf(0, null, constants.signals), 0);
    assert.equal(exitStatusOf(3, null, constants.signals), 3);
    assert.equal(exitStatusOf(null, 'SIGKILL', constants.signals), 137);
    assert.equal(exitStatusOf(null, 'SIGTERM', constants.signals), 143);
    assert.equal(exitStatusOf(null, 'SIGINT', constants.signals), 130);
    assert.equal(exitStatusOf(null, null, constants.signals), EXIT_RUNNER_FAILED);
  });
  it('distinguishes not found (127), not executable (126) and other start failures (125)', () => {
    assert.equal(exitStatusForSpawnError('ENOENT'), EXIT_NOT_FOUND);
    assert.equal(exitStatusForSpawnError('ENOTDIR'), 127);
    assert.equal(exitStatusForSpawnError('EACCES'), EXIT_NOT_EXECUTABLE);
    assert.equal(exitStatusForSpawnError('ENOEXEC'), 126);
    assert.equal(exitStatusForSpawnError('E2BIG'), 125);
    assert.equal(exitStatusForSpawnError(undefined), 125);
  });
});
