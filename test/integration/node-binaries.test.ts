/**
 * The test node's programs as the tool registry builds them (scripts/node/binaries.ts): each
 * reports the version its wrapper go.mod pins, runc is linked with libseccomp (RuntimeDefault
 * seccomp profiles need it), the CNI plugins answer the CNI VERSION command, and CoreDNS has
 * the plugins cluster DNS needs. Built on first use (`npm run tools` builds them ahead).
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { CNI_PLUGINS, COREDNS_PLUGINS, nodeBinaries } from '../../scripts/node/binaries.ts';
import { pinnedVersion } from '../../scripts/tools/build.ts';
import { TOOLS } from '../../scripts/tools/registry.ts';
import * as fx from '../helpers/fixtures.ts';

const exec = promisify(execFile);
let bin: Record<string, string>;
/** The version the registry pins for the wrapper module that builds `binary`. */
const pinned = (binary: string) => pinnedVersion(TOOLS.node.find((t) => binary in t.binaries)!);
/** What `binary args…` prints on stdout and stderr together (`env` added to this process's). */
const said = async (binary: string, args: string[], env: Record<string, string> = {}) => {
  const { stdout, stderr } = await exec(bin[binary]!, args, { env: { ...process.env, ...env } });
  return stdout + stderr;
};

before(async () => {
  bin = await nodeBinaries();
});

describe("the test node's programs, as pinned", () => {
  fx.rows(
    [
      { name: 'kubelet', args: ['--version'], want: (v: string) => `Kubernetes ${v}` },
      { name: 'kube-proxy', args: ['--version'], want: (v: string) => `Kubernetes ${v}` },
      { name: 'kube-scheduler', args: ['--version'], want: (v: string) => `Kubernetes ${v}` },
      { name: 'containerd', args: ['--version'], want: (v: string) => ` ${v}` },
      { name: 'ctr', args: ['--version'], want: (v: string) => ` ${v}` },
      { name: 'containerd-shim-runc-v2', args: ['-v'], want: (v: string) => `Version:  ${v}` },
      { name: 'runc', args: ['--version'], want: (v: string) => `runc version ${v.replace(/^v/, '')}` },
      { name: 'coredns', args: ['-version'], want: (v: string) => `CoreDNS-${v.replace(/^v/, '')}` },
    ],
    async ({ name, args, want }) => {
      assert.ok((await said(name, args)).includes(want(pinned(name))), `${name} ${args.join(' ')}`);
    },
  );

  it('runc is built with seccomp (cgo, libseccomp)', async () => {
    assert.match(await said('runc', ['--version']), /^libseccomp: \d+\.\d+\.\d+$/m);
  });

  it('each CNI plugin answers the CNI VERSION command', async () => {
    for (const plugin of CNI_PLUGINS) {
      const answer = JSON.parse(await said(plugin, [], { CNI_COMMAND: 'VERSION' })) as { supportedVersions?: string[] };
      assert.ok(answer.supportedVersions?.includes('1.0.0'), `${plugin}: ${JSON.stringify(answer)}`);
    }
  });

  it('CoreDNS has every plugin cluster DNS needs', async () => {
    const plugins = (await said('coredns', ['-plugins'])).split(/\s+/);
    for (const p of COREDNS_PLUGINS) assert.ok(plugins.includes(p), `plugin ${p}`);
  });
});
