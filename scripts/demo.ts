/**
 * `npm run demo [-- --dir DIR] [--verbose]`: a scripted walkthrough on a fresh embedded
 * control plane, using the same pieces as `npm start` (./local/system.ts). It applies
 * examples/ and checks, one printed line per step (✔ or ✖), that the system does what
 * SPEC §3–§11 promise. Exits 0 only when every step held; 1 otherwise; always stops
 * everything it started. Without --verbose, the system's own lines are shown only when a
 * step fails (the last 40).
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
  PatchStrategy,
  setHeaderOptions,
  type V1Secret,
} from '@kubernetes/client-node';
import {
  API_VERSION,
  GROUP,
  IDENTITY_KIND,
  IDENTITY_PLURAL,
  VERSION,
  type Consumer,
  type TerraformClusterIdentity,
} from '../functions/lib/api.ts';
import { isNotFound } from '../functions/lib/kube.ts';
import { ANNOTATION_SOURCE_HASH, isCurrent, mirrorName, sourceHash, type SecretLike } from '../functions/lib/mirror.ts';
import { REPO_ROOT } from './controlplane/build.ts';
import { applyExamples, loadExamples } from './local/examples.ts';
import { formatLine, type Printed } from './local/print.ts';
import { startSystem, type RunningSystem } from './local/system.ts';

const { values } = parseArgs({
  options: { dir: { type: 'string', default: '.local/demo' }, verbose: { type: 'boolean', default: false } },
});
const started = performance.now();
const recent: string[] = [];
const raw: string[] = [];
const show = (p: Printed) => {
  const line = formatLine(p);
  if (values.verbose && !p.debug) console.log(`    ${line}`);
  recent.push(line);
  if (recent.length > 40) recent.shift();
};

/** Polls `fn` until it returns something other than undefined/false; throws `what` on timeout. */
async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError = '';
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as T;
    } catch (err) {
      lastError = (err as Error).message.split('\n')[0]!;
    }
    if (Date.now() > deadline)
      throw new Error(
        `timed out after ${timeoutMs / 1000}s waiting for ${what}${lastError ? ` (last error: ${lastError})` : ''}`,
      );
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** The message of a failed API call, as kubectl would print it. */
function apiMessage(err: unknown): string {
  const body = (err as { body?: unknown }).body;
  try {
    const parsed =
      typeof body === 'string'
        ? (JSON.parse(body) as { message?: string })
        : (body as { message?: string } | undefined);
    if (parsed?.message) return parsed.message;
  } catch {
    // fall through
  }
  return (err as Error).message.split('\n')[0]!;
}

let failed = 0;
let stepNo = 0;
/** Runs one step: prints `✔ what` (plus the detail it returns) or `✖ what: why`. */
async function step(what: string, fn: () => Promise<string | void>): Promise<boolean> {
  stepNo++;
  const t0 = performance.now();
  try {
    const detail = await fn();
    console.log(
      `✔ ${String(stepNo).padStart(2)}. ${what}${detail ? ` — ${detail}` : ''} (${((performance.now() - t0) / 1000).toFixed(1)}s)`,
    );
    return true;
  } catch (err) {
    failed++;
    console.log(`✖ ${String(stepNo).padStart(2)}. ${what}: ${(err as Error).message}`);
    return false;
  }
}

let system: RunningSystem | undefined;
let interrupted = false;
const onSignal = async () => {
  interrupted = true;
  await system?.stop();
  process.exit(130);
};
process.on('SIGINT', () => void onSignal());
process.on('SIGTERM', () => void onSignal());

const ids = { group: GROUP, version: VERSION, plural: IDENTITY_PLURAL };
const plural: Record<string, string> = { TerraformCluster: 'terraformclusters', TerraformMachine: 'terraformmachines' };

try {
  await run();
} finally {
  if (!interrupted) await system?.stop();
}
const total = ((performance.now() - started) / 1000).toFixed(1);
if (failed > 0 && !values.verbose)
  console.log(`\nlast lines of the system:\n${recent.map((l) => `    ${l}`).join('\n')}`);
console.log(
  failed === 0
    ? `\ndemo passed: ${stepNo} steps in ${total}s`
    : `\ndemo FAILED: ${failed} of ${stepNo} steps in ${total}s`,
);
process.exit(failed === 0 ? 0 : 1);

async function run(): Promise<void> {
  const ok = await step(
    'start a fresh control plane, the CRDs, the three functions, the webhook and the events',
    async () => {
      system = await startSystem({
        dir: values.dir!,
        print: show,
        progress: (l) => values.verbose && console.log(`    ${l}`),
        onRawLine: (_c, l) => raw.push(l),
        // Short back-off so a retried event does not stall a step.
        backoffMs: 200,
      });
      return `events from ${system.eventSource === 'adapter' ? "Knative's ApiServerSource adapter" : 'the local event source'}; KUBECONFIG=${system.kubeconfigPath}`;
    },
  );
  if (!ok || !system) return;
  const sys = system;
  const cp = sys.controlPlane!;
  const kc = new KubeConfig();
  kc.loadFromFile(sys.kubeconfigPath);
  const core = kc.makeApiClient(CoreV1Api);
  const custom = kc.makeApiClient(CustomObjectsApi);
  const readMirror = async (namespace: string, identity: string): Promise<V1Secret | undefined> => {
    try {
      return await core.readNamespacedSecret({ namespace, name: mirrorName(identity) });
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  };
  const identity = (name: string) =>
    custom.getClusterCustomObject({ ...ids, name }) as Promise<TerraformClusterIdentity>;
  const consumers = loadExamples().filter(
    (o) => o.kind === 'TerraformCluster' || o.kind === 'TerraformMachine',
  ) as Consumer[];

  const steps: [string, () => Promise<string | void>][] = [
    [
      'apply examples/ (server-side, as `kubectl apply` would)',
      async () => {
        const applied = await applyExamples(kc);
        return `${applied.length} objects: namespaces, 2 source Secrets, 2 identities, ${consumers.length} consumers, tenant RBAC`;
      },
    ],

    [
      "each namespace gets its mirror, owned by exactly the objects that use it, with the source's data",
      async () => {
        const groups = new Map<string, Consumer[]>();
        for (const c of consumers) {
          const key = `${c.metadata.namespace}/${c.spec!.identityRef!.name}`;
          groups.set(key, [...(groups.get(key) ?? []), c]);
        }
        const seen: string[] = [];
        for (const [key, users] of groups) {
          const [namespace, id] = key.split('/') as [string, string];
          const idObj = await identity(id);
          const source = await core.readNamespacedSecret({
            namespace: idObj.spec.secretRef.namespace,
            name: idObj.spec.secretRef.name,
          });
          const uids = await Promise.all(
            users.map(
              async (u) =>
                `${u.kind}/${u.metadata.name}/${((await custom.getNamespacedCustomObject({ group: GROUP, version: VERSION, namespace, plural: plural[u.kind!]!, name: u.metadata.name! })) as Consumer).metadata.uid}`,
            ),
          );
          await waitFor(
            `mirror ${namespace}/${mirrorName(id)} owned by ${users.map((u) => u.metadata.name).join(', ')}`,
            async () => {
              const m = await readMirror(namespace, id);
              if (!m || !isCurrent(m as SecretLike, sourceHash(source.data))) return false;
              const owners = (m.metadata?.ownerReferences ?? []).map((o) => `${o.kind}/${o.name}/${o.uid}`).sort();
              return (
                owners.join(',') === [...uids].sort().join(',') &&
                (m.metadata?.ownerReferences ?? []).every((o) => o.apiVersion === API_VERSION)
              );
            },
          );
          seen.push(`${namespace}/${mirrorName(id)} ← ${users.map((u) => `${u.kind}/${u.metadata.name}`).join(' + ')}`);
        }
        return seen.join('; ');
      },
    ],

    [
      'every consumer reports CredentialsMirrored=True (Mirrored)',
      async () => {
        for (const c of consumers) {
          await waitFor(`${c.metadata.namespace}/${c.metadata.name} CredentialsMirrored=True`, async () => {
            const o = (await custom.getNamespacedCustomObject({
              group: GROUP,
              version: VERSION,
              namespace: c.metadata.namespace!,
              plural: plural[c.kind!]!,
              name: c.metadata.name!,
            })) as Consumer;
            return o.status?.conditions?.some(
              (x) => x.type === 'CredentialsMirrored' && x.status === 'True' && x.reason === 'Mirrored',
            );
          });
        }
        return `${consumers.length} of ${consumers.length}`;
      },
    ],

    [
      'a status ping makes each identity Ready=True (SecretFound) and lists where it is in use',
      async () => {
        await sys.ping('status');
        const want: Record<string, string[]> = { 'aws-prod': ['team-a', 'team-b'], 'gcp-dev': ['team-c'] };
        for (const [id, namespaces] of Object.entries(want)) {
          await waitFor(`${id} status`, async () => {
            const o = await identity(id);
            return (
              o.status?.conditions?.some(
                (x) => x.type === 'Ready' && x.status === 'True' && x.reason === 'SecretFound',
              ) && JSON.stringify(o.status?.namespaces) === JSON.stringify(namespaces)
            );
          });
        }
        return 'aws-prod in [team-a, team-b], gcp-dev in [team-c]';
      },
    ],

    [
      'rotation: a new source value reaches every mirror after one resync',
      async () => {
        await core.patchNamespacedSecret(
          {
            namespace: 'captf-system',
            name: 'aws-prod-credentials',
            body: { stringData: { AWS_SECRET_ACCESS_KEY: `rotated-fake-key-${Date.now()}` } },
          },
          // A strategic merge patch, as `kubectl patch secret … -p '{"stringData":…}'` sends.
          setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
        );
        const source = await core.readNamespacedSecret({ namespace: 'captf-system', name: 'aws-prod-credentials' });
        const hash = sourceHash(source.data);
        await sys.ping('resync');
        for (const ns of ['team-a', 'team-b']) {
          await waitFor(`${ns} mirror of aws-prod to carry the new data`, async () => {
            const m = await readMirror(ns, 'aws-prod');
            return m && isCurrent(m as SecretLike, hash) && m.metadata?.annotations?.[ANNOTATION_SOURCE_HASH] === hash;
          });
        }
        return 'team-a and team-b mirrors match the rotated source';
      },
    ],

    [
      'captf-runner drops TF_* and KUBE_* variables before Terraform starts (env built from the team-c mirror)',
      async () => {
        const m = await readMirror('team-c', 'gcp-dev');
        if (!m?.data) throw new Error('no mirror in team-c');
        const env: Record<string, string> = {
          PATH: process.env.PATH ?? '/usr/bin:/bin',
          TF_VAR_region: 'europe-west1',
          KUBE_CONFIG_PATH: '/nonexistent',
        };
        for (const [k, v] of Object.entries(m.data)) env[k] = Buffer.from(v, 'base64').toString('utf8');
        const printKeys = 'process.stdout.write(JSON.stringify(Object.keys(process.env).sort()))';
        const { code, stdout, stderr } = await new Promise<{ code: number | null; stdout: string; stderr: string }>(
          (resolve, reject) => {
            const child = spawn(
              process.execPath,
              [join(REPO_ROOT, 'functions', 'runner', 'index.ts'), '--', process.execPath, '-e', printKeys],
              { env, stdio: ['ignore', 'pipe', 'pipe'] },
            );
            let out = '';
            let err = '';
            child.stdout.on('data', (d: Buffer) => (out += d.toString()));
            child.stderr.on('data', (d: Buffer) => (err += d.toString()));
            child.on('error', reject);
            child.on('close', (c) => resolve({ code: c, stdout: out, stderr: err }));
          },
        );
        raw.push(stdout, stderr);
        if (code !== 0) throw new Error(`runner exited ${code}`);
        const seen = JSON.parse(stdout) as string[];
        const leaked = seen.filter((k) => /^(tf|kube)_/i.test(k));
        if (leaked.length) throw new Error(`the command still saw ${leaked.join(', ')}`);
        const kept = Object.keys(m.data).filter((k) => !/^(tf|kube)_/i.test(k));
        const missing = kept.filter((k) => !seen.includes(k));
        if (missing.length) throw new Error(`the command lost ${missing.join(', ')}`);
        const line = JSON.parse(stderr.split('\n').find((l) => l.includes('environment filtered')) ?? '{}') as {
          removed?: string[];
        };
        const expected = ['KUBE_CONFIG_PATH', 'TF_TOKEN_app_terraform_io', 'TF_VAR_region'];
        if (JSON.stringify(line.removed) !== JSON.stringify(expected))
          throw new Error(
            `runner reported removed=${JSON.stringify(line.removed)}, expected ${JSON.stringify(expected)}`,
          );
        return `removed ${expected.join(', ')}; kept ${kept.sort().join(', ')}`;
      },
    ],

    [
      'narrowing aws-prod to [team-a] revokes team-b: its mirror is deleted and staging says NamespaceNotAllowed',
      async () => {
        await custom.patchClusterCustomObject(
          { ...ids, name: 'aws-prod', body: { spec: { allowedNamespaces: { list: ['team-a'] } } } },
          setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
        );
        await waitFor(
          'the team-b mirror to be deleted',
          async () => (await readMirror('team-b', 'aws-prod')) === undefined,
        );
        await waitFor('team-b/staging IdentityAllowed=False', async () => {
          const o = (await custom.getNamespacedCustomObject({
            group: GROUP,
            version: VERSION,
            namespace: 'team-b',
            plural: 'terraformclusters',
            name: 'staging',
          })) as Consumer;
          return (
            o.status?.conditions?.some(
              (x) => x.type === 'IdentityAllowed' && x.status === 'False' && x.reason === 'NamespaceNotAllowed',
            ) && !o.status?.conditions?.some((x) => x.type === 'CredentialsMirrored' && x.status === 'True')
          );
        });
        if (!(await readMirror('team-a', 'aws-prod'))) throw new Error('team-a lost its mirror too');
        return 'team-b/captf-creds-aws-prod gone; team-a keeps its mirror';
      },
    ],

    [
      'an unprivileged user who may create identities but not read the Secret is denied by the webhook',
      async () => {
        // examples/40-tenant-rbac.yaml lets the group "tenants" create identities.
        const aliceKc = new KubeConfig();
        aliceKc.loadFromFile(await cp.userKubeConfig('alice', ['tenants']));
        const alice = aliceKc.makeApiClient(CustomObjectsApi);
        const canRead = await aliceKc
          .makeApiClient(CoreV1Api)
          .readNamespacedSecret({ namespace: 'captf-system', name: 'aws-prod-credentials' })
          .then(
            () => true,
            () => false,
          );
        if (canRead) throw new Error('alice can read the source Secret; the step would prove nothing');
        const body = {
          apiVersion: API_VERSION,
          kind: IDENTITY_KIND,
          metadata: { name: 'alice-borrows-aws' },
          spec: {
            secretRef: { namespace: 'captf-system', name: 'aws-prod-credentials' },
            allowedNamespaces: { list: ['team-b'] },
          },
        };
        const denial = await waitFor(
          'the webhook to deny alice',
          async () => {
            try {
              await alice.createClusterCustomObject({ ...ids, body });
            } catch (err) {
              const msg = apiMessage(err);
              if (/denied the request/.test(msg)) return msg;
              throw err; // e.g. RBAC not yet effective: try again
            }
            await custom.deleteClusterCustomObject({ ...ids, name: 'alice-borrows-aws' });
            throw new Error('alice was allowed to create an identity on a Secret she cannot read');
          },
          30_000,
        );
        return denial.length > 160 ? `${denial.slice(0, 157)}…` : denial;
      },
    ],

    [
      'deleting an identity still in use is refused',
      async () => {
        try {
          await custom.deleteClusterCustomObject({ ...ids, name: 'gcp-dev' });
        } catch (err) {
          const msg = apiMessage(err);
          if (!/denied the request/.test(msg)) throw err;
          return msg.length > 160 ? `${msg.slice(0, 157)}…` : msg;
        }
        throw new Error('gcp-dev was deleted while team-c used it');
      },
    ],

    [
      '…and allowed once unused: consumers deleted, mirror gone, status refreshed',
      async () => {
        for (const c of consumers.filter((x) => x.spec?.identityRef?.name === 'gcp-dev')) {
          await custom.deleteNamespacedCustomObject({
            group: GROUP,
            version: VERSION,
            namespace: c.metadata.namespace!,
            plural: plural[c.kind!]!,
            name: c.metadata.name!,
          });
        }
        await waitFor(
          'the team-c mirror to be gone',
          async () => (await readMirror('team-c', 'gcp-dev')) === undefined,
        );
        await sys.ping('status');
        await waitFor(
          'gcp-dev status.namespaces to be empty',
          async () => ((await identity('gcp-dev')).status?.namespaces ?? []).length === 0,
        );
        await custom.deleteClusterCustomObject({ ...ids, name: 'gcp-dev' });
        await waitFor('gcp-dev to be gone', async () =>
          identity('gcp-dev').then(
            () => false,
            (e: unknown) => isNotFound(e),
          ),
        );
        return 'gcp-dev deleted';
      },
    ],

    [
      'no credential value appeared in any output line of the functions, the event source or the runner',
      async () => {
        const values = new Set<string>();
        for (const o of loadExamples()) {
          for (const v of Object.values((o as { stringData?: Record<string, string> }).stringData ?? {})) values.add(v);
        }
        const src = await core.readNamespacedSecret({ namespace: 'captf-system', name: 'aws-prod-credentials' });
        for (const v of Object.values(src.data ?? {})) values.add(Buffer.from(v, 'base64').toString('utf8'));
        const hits = raw.filter((l) => [...values].some((v) => v.length >= 8 && l.includes(v)));
        if (hits.length) throw new Error(`${hits.length} line(s) contain a credential value`);
        return `${raw.length} lines scanned for ${values.size} values`;
      },
    ],
  ];
  for (const [what, fn] of steps) {
    if (!(await step(what, fn))) {
      console.log(`  (stopping: later steps depend on this one)`);
      return;
    }
  }
}
