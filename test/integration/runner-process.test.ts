/**
 * captf-runner as a real process (SPEC §11): the environment its command sees, the one JSON
 * line it writes, exit statuses, signal forwarding, stdin/stdout passthrough, and no planted
 * value anywhere in its output. The command is a small Node program (this Node binary).
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { assertNoSecret, sentinel } from '../helpers/logs.ts';

const RUNNER = fileURLToPath(new URL('../../functions/runner/index.ts', import.meta.url));
const NODE = process.execPath;
const sha = (s: string | Buffer) => createHash('sha256').update(s).digest('hex');

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: string;
  child: ChildProcess;
}

/**
 * Runs `node functions/runner/index.ts <args>` with exactly `env` (nothing inherited).
 * @param opts.stdin bytes written to its stdin (then closed).
 * @param opts.whenStdout called with the runner process once its stdout contains this text.
 */
function runRunner(
  args: string[],
  env: Record<string, string>,
  opts: {
    stdin?: Buffer | string;
    whenStdout?: [text: string, act: (c: ChildProcess) => void];
    detached?: boolean;
    argv0?: string[];
  } = {},
): Promise<Run> {
  return new Promise((resolve, reject) => {
    const argv = opts.argv0 ?? [NODE, RUNNER];
    const child = spawn(argv[0]!, [...argv.slice(1), ...args], {
      env,
      stdio: 'pipe',
      detached: opts.detached ?? false,
    });
    const out: Buffer[] = [];
    let err = '';
    let acted = false;
    child.stdout.on('data', (d: Buffer) => {
      out.push(d);
      if (opts.whenStdout && !acted && Buffer.concat(out).toString().includes(opts.whenStdout[0])) {
        acted = true;
        opts.whenStdout[1](child);
      }
    });
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ code, signal, stdout: Buffer.concat(out), stderr: err, child }));
    if (opts.stdin !== undefined) child.stdin.end(opts.stdin);
    else child.stdin.end();
  });
}

const baseEnv = (): Record<string, string> => ({ PATH: process.env.PATH ?? '/usr/bin:/bin' });
const jsonLines = (stderr: string) =>
  stderr
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);

// A command that prints {name: sha256(value)} for its whole environment (values never printed).
const PRINT_ENV = `const {createHash}=require('node:crypto');const o={};for(const[k,v]of Object.entries(process.env))o[k]=createHash('sha256').update(v).digest('hex');process.stdout.write(JSON.stringify(o))`;

const tmp = mkdtempSync(join(tmpdir(), 'captf-runner-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

describe('captf-runner filters the environment', () => {
  it('removes TF_/KUBE_ variables in any case, keeps the three exceptions and everything else, logs names only', async () => {
    const planted = {
      TF_VAR_token: sentinel(),
      TF_LOG: sentinel(),
      TF_CLI_ARGS_apply: sentinel(),
      KUBE_CONFIG_PATH: sentinel(),
      tf_var_lower: sentinel(),
      Kube_Token: sentinel(),
      'TF_VAR_a.b': sentinel(),
      tf_input: sentinel(),
    };
    const kept = {
      TF_IN_AUTOMATION: '1',
      TF_INPUT: '0',
      KUBE_NAMESPACE: 'team-a',
      AWS_ACCESS_KEY_ID: sentinel(),
      AWS_SECRET_ACCESS_KEY: sentinel(),
      'aws.key': sentinel(),
      '1token': sentinel(),
      'my-key': sentinel(),
      KUBECONFIG: '/nonexistent',
      LOG_LEVEL: 'error',
    };
    const r = await runRunner(['--', NODE, '-e', PRINT_ENV], { ...baseEnv(), ...planted, ...kept });
    assert.equal(r.code, 0, r.stderr);
    const seen = JSON.parse(r.stdout.toString()) as Record<string, string>;
    for (const name of Object.keys(planted)) assert.ok(!(name in seen), `${name} reached the command`);
    for (const [name, value] of Object.entries(kept))
      assert.equal(seen[name], sha(value), `${name} reached the command unchanged`);
    assert.equal(seen.PATH, sha(baseEnv().PATH!));

    // Exactly one line, even with LOG_LEVEL=error; names sorted; no values anywhere.
    const lines = jsonLines(r.stderr);
    assert.equal(lines.length, 1, r.stderr);
    assert.equal(lines[0]!.message, 'environment filtered');
    assert.equal(lines[0]!.component, 'captf-runner');
    assert.deepEqual(lines[0]!.removed, Object.keys(planted).sort());
    assertNoSecret(
      r.stdout.toString() + r.stderr,
      [...Object.values(planted), ...Object.values(kept).filter((v) => v.startsWith('SENTINEL-'))],
      'runner output',
    );
  });

  it('never logs the command arguments (they may carry secrets)', async () => {
    const secret = sentinel();
    const r = await runRunner(['--', NODE, '-e', 'process.exit(0)', '--', `-var=password=${secret}`], baseEnv());
    assert.equal(r.code, 0);
    assertNoSecret(r.stderr, [secret], 'runner log');
    assert.equal(jsonLines(r.stderr)[0]!.command, NODE);
  });
});

describe('captf-runner passes the command through', () => {
  it('exits with the command exit code', async () => {
    for (const code of [0, 3, 255]) {
      const r = await runRunner(['--', NODE, '-e', `process.exit(${code})`], baseEnv());
      assert.equal(r.code, code);
      assert.equal(r.signal, null);
    }
  });

  it('exits 128 + n when the command is killed by signal n', async () => {
    for (const [sig, status] of [
      ['SIGKILL', 137],
      ['SIGTERM', 143],
      ['SIGSEGV', 139],
    ] as const) {
      const r = await runRunner(['--', NODE, '-e', `process.kill(process.pid, '${sig}')`], baseEnv());
      assert.equal(r.code, status, sig);
      assert.equal(r.signal, null, 'the runner itself exits normally');
    }
  });

  it('passes stdin through and leaves stdout to the command alone', async () => {
    const input = Buffer.concat([Buffer.from('line one\n'), Buffer.from([0, 1, 2, 0xff, 0xfe]), Buffer.from('\nend')]);
    const r = await runRunner(['--', NODE, '-e', 'process.stdin.pipe(process.stdout)'], baseEnv(), { stdin: input });
    assert.equal(r.code, 0);
    assert.deepEqual(r.stdout, input, 'stdout holds exactly the command output');
  });

  it('writes its JSON line before the command starts, so the shared stderr reads in order', async () => {
    const r = await runRunner(['--', NODE, '-e', `process.stderr.write('from the command\\n')`], baseEnv());
    assert.equal(r.code, 0);
    const [first, second, ...rest] = r.stderr.split('\n');
    assert.equal((JSON.parse(first!) as { message: string }).message, 'environment filtered');
    assert.equal(second, 'from the command');
    assert.deepEqual(rest, ['']);
  });

  // The command announces it is ready, traps the signal, and exits with its own status.
  const TRAP = (sig: string, status: number) =>
    `process.on('${sig}',()=>{process.stdout.write('got ${sig}\\n');process.exit(${status})});process.stdout.write('ready\\n');setInterval(()=>{},1000)`;
  for (const [i, sig] of (['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGQUIT'] as const).entries()) {
    it(`forwards ${sig} to the command and exits with the command's status`, async () => {
      const status = 40 + i;
      const r = await runRunner(['--', NODE, '-e', TRAP(sig, status)], baseEnv(), {
        whenStdout: ['ready', (c) => c.kill(sig)],
      });
      assert.equal(r.stdout.toString(), `ready\ngot ${sig}\n`);
      assert.equal(r.code, status);
      assert.equal(r.signal, null);
    });
  }

  it('forwards SIGTERM to a command without a handler and reports 143 (the runner does not die first)', async () => {
    const r = await runRunner(
      ['--', NODE, '-e', `process.stdout.write('ready\\n');setInterval(()=>{},1000)`],
      baseEnv(),
      {
        whenStdout: ['ready', (c) => c.kill('SIGTERM')],
      },
    );
    assert.equal(r.code, 143);
    assert.equal(r.signal, null);
  });

  it('delivers a process-group signal (Ctrl-C in a terminal) to the command once, not twice', async () => {
    const count = `let n=0;process.on('SIGINT',()=>{if(n++===0)setTimeout(()=>{process.stdout.write('interrupts='+n+'\\n');process.exit(0)},300)});process.stdout.write('ready\\n');setInterval(()=>{},1000)`;
    const r = await runRunner(['--', NODE, '-e', count], baseEnv(), {
      detached: true, // the runner leads its own process group, like a shell job
      whenStdout: ['ready', (c) => process.kill(-c.pid!, 'SIGINT')],
    });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout.toString(), /interrupts=1\n$/);
  });
});

describe('captf-runner refuses clearly', () => {
  const cases: { name: string; args: () => string[]; status: number; message: RegExp }[] = [
    { name: 'no arguments', args: () => [], status: 2, message: /no command given; usage: captf-runner -- <command>/ },
    { name: 'nothing after --', args: () => ['--'], status: 2, message: /no command given after "--"/ },
    {
      name: 'a command without --',
      args: () => ['terraform', 'apply'],
      status: 2,
      message: /expected "--" before the command, got "terraform"/,
    },
    {
      name: 'a command that does not exist',
      args: () => ['--', 'captf-no-such-command-xyz'],
      status: 127,
      message: /command not found: captf-no-such-command-xyz/,
    },
    {
      name: 'a file that is not executable',
      args: () => {
        const f = join(tmp, 'not-executable.sh');
        writeFileSync(f, '#!/bin/sh\nexit 0\n');
        chmodSync(f, 0o644);
        return ['--', f];
      },
      status: 126,
      message: /command is not executable: .*not-executable\.sh/,
    },
    { name: 'a directory', args: () => ['--', tmp], status: 126, message: /command is not executable/ },
  ];
  for (const c of cases) {
    it(`exits ${c.status} for ${c.name}, with a JSON error line on stderr`, async () => {
      const r = await runRunner(c.args(), baseEnv());
      assert.equal(r.code, c.status, r.stderr);
      assert.equal(r.stdout.length, 0);
      const errors = jsonLines(r.stderr).filter((l) => l.level === 'error');
      assert.equal(errors.length, 1, r.stderr);
      assert.match(String(errors[0]!.message), c.message);
    });
  }

  it('prints the usage on --help and exits 0', async () => {
    const r = await runRunner(['--help'], baseEnv());
    assert.equal(r.code, 0);
    assert.equal(r.stdout.toString(), 'usage: captf-runner -- <command> [args...]\n');
  });
});

describe('captf-runner as the package bin', () => {
  it('is executable and runs through its #!/usr/bin/env node line with Node 24 on PATH', async () => {
    assert.ok((statSync(RUNNER).mode & 0o111) !== 0, 'functions/runner/index.ts has the executable bit');
    const env = { PATH: `${dirname(NODE)}:${baseEnv().PATH}`, TF_LOG: sentinel() };
    const r = await runRunner(['--', NODE, '-e', `process.stdout.write(String('TF_LOG' in process.env))`], env, {
      argv0: [RUNNER],
    });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.toString(), 'false');
    assert.deepEqual(jsonLines(r.stderr)[0]!.removed, ['TF_LOG']);
  });
});
