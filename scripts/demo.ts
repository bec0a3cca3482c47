/**
 * `npm run demo [-- --dir DIR] [--verbose]`: a scripted walkthrough on a fresh embedded
 * control plane, using the same pieces as `npm start` (./system/system.ts). It applies
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
  PatchStrategy,
  setHeaderOptions,
  type KubeConfig,
  type V1Secret,
} from '@kubernetes/client-node';
import {
  API_VERSION,
  DEFAULT_CONSUMER_KINDS,
  type Condition,
  type Consumer,
  type TerraformClusterIdentity,
} from '../functions/lib/api.ts';
import { getCondition } from '../functions/lib/conditions.ts';
import { untrustedServerMessage } from '../functions/lib/api-errors.ts';
import { DEFAULT_PREPARE_AUDIENCE } from '../functions/mirror-sync/authorize.ts';
import { ignoreNotFound, isNotFound, loadKubeConfig, retryOnConflict } from '../functions/lib/kube.ts';
import { consumerObjects, identities } from '../functions/lib/objects.ts';
import { ANNOTATION_SOURCE_HASH, isCurrent, mirrorName, sourceHash, type SecretLike } from '../functions/lib/mirror.ts';
import { REPO_ROOT } from './tools/build.ts';
import { applyExamples, loadExamples } from './local/examples.ts';
import { formatLine, type Printed } from './local/print.ts';
import { stopOnSignal } from './lib/process.ts';
import { startSystem, type RunningSystem } from './system/system.ts';
import { serviceAccountToken } from './lib/serviceaccount.ts';
import { eventually } from './lib/wait.ts';

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
// A signal while the system starts aborts the start (which stops what it began); later it stops the system.
const signal = stopOnSignal(() => system?.stop());

const SOURCE = { namespace: 'captf-system', name: 'aws-prod-credentials' };
/** Variables the runner removes before Terraform starts. */
const TF_OR_KUBE = /^(tf|kube)_/i;
/** The variables the runner must report removing for the runner step's environment. */
const RUNNER_REMOVES = ['KUBE_CONFIG_PATH', 'TF_TOKEN_app_terraform_io', 'TF_VAR_region'];

try {
  await run();
} finally {
  if (!signal.aborted) await system?.stop();
}
if (signal.aborted) process.exit(130);
const total = ((performance.now() - started) / 1000).toFixed(1);
if (failed > 0 && !values.verbose)
  console.log(`\nlast lines of the system:\n${recent.map((l) => `    ${l}`).join('\n')}`);
console.log(
  failed === 0
    ? `\ndemo passed: ${stepNo} steps in ${total}s`
    : `\ndemo FAILED: ${failed} of ${stepNo} steps in ${total}s`,
);
process.exit(failed === 0 ? 0 : 1);

/** The walkthrough: each step a named function below, stopping at the first that fails. */
async function run(): Promise<void> {
  const ok = await step(
    "start a fresh control plane, the CRDs, the four functions, the webhook, and Knative's adapter and Broker",
    startTheSystem,
  );
  if (!ok || !system) return;
  const demo = newDemo(system);
  const steps: [string, (d: Demo) => Promise<string>][] = [
    ['apply examples/ (server-side, as `kubectl apply` would)', applyTheExamples],
    [
      "each namespace gets its mirror, owned by exactly the objects that use it, with the source's data",
      mirrorsOwnedByTheirUsers,
    ],
    ['every consumer reports CredentialsMirrored=True (Mirrored)', consumersReportMirrored],
    ['a status ping makes each identity Ready=True (SecretFound) and lists where it is in use', identitiesReady],
    ['rotation: a new source value reaches every mirror after one resync', rotationReachesMirrors],
    [
      "the provider's manager calls prepare with a token for audience captf-mirror-sync; without one it is refused 401",
      managerPrepares,
    ],
    [
      'captf-runner drops TF_* and KUBE_* variables before Terraform starts (env built from the team-c mirror)',
      runnerDropsTerraformVariables,
    ],
    [
      'narrowing aws-prod to [team-a] revokes team-b: its mirror is deleted and staging says NamespaceNotAllowed',
      narrowingRevokesTeamB,
    ],
    [
      'an unprivileged user who may create identities but not read the Secret is denied by the webhook',
      webhookDeniesAlice,
    ],
    ['deleting an identity still in use is refused', deletingInUseIdentityRefused],
    ['…and allowed once unused: consumers deleted, mirror gone, status refreshed', deletingUnusedIdentityAllowed],
    [
      "no credential value appeared in any output line of the functions, Knative's processes or the runner",
      noCredentialInOutput,
    ],
  ];
  for (const [what, fn] of steps) {
    if (!(await step(what, () => fn(demo)))) {
      console.log(`  (stopping: later steps depend on this one)`);
      return;
    }
  }
}

/** What the steps after the first work with. */
interface Demo {
  sys: RunningSystem;
  kc: KubeConfig;
  core: CoreV1Api;
  custom: CustomObjectsApi;
  /** The TerraformClusters and TerraformMachines of examples/. */
  consumers: Consumer[];
}

function newDemo(sys: RunningSystem): Demo {
  const kc = loadKubeConfig(sys.kubeconfigPath);
  const consumers = loadExamples().filter(
    (o) => o.kind === 'TerraformCluster' || o.kind === 'TerraformMachine',
  ) as Consumer[];
  return { sys, kc, core: kc.makeApiClient(CoreV1Api), custom: kc.makeApiClient(CustomObjectsApi), consumers };
}

/** The mirror of `identity` in `namespace`, or undefined. */
function readMirror(d: Demo, namespace: string, identity: string): Promise<V1Secret | undefined> {
  return ignoreNotFound(d.core.readNamespacedSecret({ namespace, name: mirrorName(identity) }));
}

function readIdentity(d: Demo, name: string): Promise<TerraformClusterIdentity> {
  return identities(d).get({ name });
}

/** The objects of consumer `c`'s kind (one of the shipped two). */
function consumersLike(d: Demo, c: Consumer) {
  return consumerObjects(
    d,
    DEFAULT_CONSUMER_KINDS.find((k) => k.kind === c.kind)!,
  );
}

/** A consumer as it is now. */
function readConsumer(d: Demo, c: Consumer): Promise<Consumer> {
  return consumersLike(d, c).get({ namespace: c.metadata.namespace!, name: c.metadata.name! });
}

/** Whether `o` has a condition `type` with `status` (and `reason` when given). */
function hasCondition(
  o: { status?: { conditions?: Condition[] } },
  want: { type: string; status: string; reason?: string },
): boolean {
  const c = getCondition(o.status?.conditions, want.type);
  return c?.status === want.status && (!want.reason || c.reason === want.reason);
}

/** At most 160 characters of `text`. */
function shorten(text: string): string {
  return text.length > 160 ? `${text.slice(0, 157)}…` : text;
}

async function startTheSystem(): Promise<string> {
  system = await startSystem({
    dir: values.dir!,
    functions: 'source',
    events: 'broker',
    webhook: true,
    prepareCaller: true,
    print: show,
    progress: (l) => values.verbose && console.log(`    ${l}`),
    onRawLine: (_c, l) => raw.push(l),
    signal,
  });
  return `events: Knative's ApiServerSource adapter → Broker → Triggers; KUBECONFIG=${system.kubeconfigPath}`;
}

async function applyTheExamples(d: Demo): Promise<string> {
  const applied = await applyExamples(d.kc);
  return `${applied.length} objects: namespaces, 2 source Secrets, 2 identities, ${d.consumers.length} consumers, tenant RBAC`;
}

async function mirrorsOwnedByTheirUsers(d: Demo): Promise<string> {
  const groups = new Map<string, Consumer[]>();
  for (const c of d.consumers) {
    const key = `${c.metadata.namespace}/${c.spec!.identityRef!.name}`;
    groups.set(key, [...(groups.get(key) ?? []), c]);
  }
  const seen: string[] = [];
  for (const [key, users] of groups) {
    const [namespace, id] = key.split('/') as [string, string];
    await mirrorOwnedBy(d, { namespace, id, users });
    seen.push(`${namespace}/${mirrorName(id)} ← ${users.map((u) => `${u.kind}/${u.metadata.name}`).join(' + ')}`);
  }
  return seen.join('; ');
}

/** Waits until the mirror of `id` in `namespace` is current and owned by exactly `users`. */
async function mirrorOwnedBy(d: Demo, { namespace, id, users }: { namespace: string; id: string; users: Consumer[] }) {
  const idObj = await readIdentity(d, id);
  const { namespace: sourceNamespace, name: sourceName } = idObj.spec.secretRef;
  const source = await d.core.readNamespacedSecret({ namespace: sourceNamespace, name: sourceName });
  const uids = await Promise.all(
    users.map(async (u) => `${u.kind}/${u.metadata.name}/${(await readConsumer(d, u)).metadata.uid}`),
  );
  await eventually(
    `mirror ${namespace}/${mirrorName(id)} owned by ${users.map((u) => u.metadata.name).join(', ')}`,
    async () => {
      const m = await readMirror(d, namespace, id);
      if (!m || !isCurrent(m as SecretLike, sourceHash(source.data))) return false;
      const refs = m.metadata?.ownerReferences ?? [];
      const owners = refs.map((o) => `${o.kind}/${o.name}/${o.uid}`).sort();
      return owners.join(',') === [...uids].sort().join(',') && refs.every((o) => o.apiVersion === API_VERSION);
    },
  );
}

async function consumersReportMirrored(d: Demo): Promise<string> {
  for (const c of d.consumers) {
    await eventually(`${c.metadata.namespace}/${c.metadata.name} CredentialsMirrored=True`, async () =>
      hasCondition(await readConsumer(d, c), { type: 'CredentialsMirrored', status: 'True', reason: 'Mirrored' }),
    );
  }
  return `${d.consumers.length} of ${d.consumers.length}`;
}

async function identitiesReady(d: Demo): Promise<string> {
  await d.sys.broker!.ping('status');
  const want: Record<string, string[]> = { 'aws-prod': ['team-a', 'team-b'], 'gcp-dev': ['team-c'] };
  for (const [id, namespaces] of Object.entries(want)) {
    await eventually(`${id} status`, async () => {
      const o = await readIdentity(d, id);
      return (
        hasCondition(o, { type: 'Ready', status: 'True', reason: 'SecretFound' }) &&
        JSON.stringify(o.status?.namespaces) === JSON.stringify(namespaces)
      );
    });
  }
  return 'aws-prod in [team-a, team-b], gcp-dev in [team-c]';
}

async function rotationReachesMirrors(d: Demo): Promise<string> {
  await d.core.patchNamespacedSecret(
    { ...SOURCE, body: { stringData: { AWS_SECRET_ACCESS_KEY: `rotated-fake-key-${Date.now()}` } } },
    // A strategic merge patch, as `kubectl patch secret … -p '{"stringData":…}'` sends.
    setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
  );
  const hash = sourceHash((await d.core.readNamespacedSecret(SOURCE)).data);
  await d.sys.broker!.ping('resync');
  for (const ns of ['team-a', 'team-b']) {
    await eventually(`${ns} mirror of aws-prod to carry the new data`, async () => {
      const m = await readMirror(d, ns, 'aws-prod');
      return m && isCurrent(m as SecretLike, hash) && m.metadata?.annotations?.[ANNOTATION_SOURCE_HASH] === hash;
    });
  }
  return 'team-a and team-b mirrors match the rotated source';
}

/**
 * The provider's manager before a Job: `POST /prepare` with its ServiceAccount's token for the
 * audience captf-mirror-sync (as `kubectl create token … --audience captf-mirror-sync` mints it);
 * 200 names the mirror and its hash. The same call without a token is refused before anything
 * about the object is looked at.
 */
async function managerPrepares(d: Demo): Promise<string> {
  const sa = d.sys.prepareCaller;
  if (!sa) throw new Error('the system has no prepare caller (embedded control plane only)');
  const token = await serviceAccountToken(d.kc, { ...sa, audience: DEFAULT_PREPARE_AUDIENCE });
  const call = (authorization?: string) =>
    fetch(`${d.sys.functions['mirror-sync'].url}/prepare`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
      body: JSON.stringify({ apiVersion: API_VERSION, kind: 'TerraformCluster', namespace: 'team-a', name: 'prod' }),
    });
  const ok = await call(`Bearer ${token}`);
  const body = (await ok.json()) as { mirror?: string; sourceHash?: string };
  if (ok.status !== 200 || body.mirror !== mirrorName('aws-prod') || !/^[0-9a-f]{64}$/.test(body.sourceHash ?? ''))
    throw new Error(`prepare answered ${ok.status}, not 200 with the mirror and its source hash`);
  const anonymous = await call();
  await anonymous.arrayBuffer();
  if (anonymous.status !== 401) throw new Error(`prepare without a token answered ${anonymous.status}, not 401`);
  // The hash is not printed: it would let whoever reads the terminal check a guessed credential.
  return `200 {mirror: ${body.mirror}, sourceHash: (64 hex)} as ${sa.namespace}/${sa.name}; 401 without a token`;
}

/** Runs `node <args>` with exactly `env`, capturing its output. */
function runNode(
  args: string[],
  env: NodeJS.ProcessEnv,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

async function runnerDropsTerraformVariables(d: Demo): Promise<string> {
  const m = await readMirror(d, 'team-c', 'gcp-dev');
  if (!m?.data) throw new Error('no mirror in team-c');
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    TF_VAR_region: 'europe-west1',
    KUBE_CONFIG_PATH: '/nonexistent',
  };
  for (const [k, v] of Object.entries(m.data)) env[k] = Buffer.from(v, 'base64').toString('utf8');
  const printKeys = 'process.stdout.write(JSON.stringify(Object.keys(process.env).sort()))';
  const runner = join(REPO_ROOT, 'functions', 'runner', 'index.ts');
  const { code, stdout, stderr } = await runNode([runner, '--', process.execPath, '-e', printKeys], env);
  raw.push(stdout, stderr);
  if (code !== 0) throw new Error(`runner exited ${code}`);
  const kept = checkRunnerOutput({ mirrorKeys: Object.keys(m.data), seen: JSON.parse(stdout) as string[], stderr });
  return `removed ${RUNNER_REMOVES.join(', ')}; kept ${kept.sort().join(', ')}`;
}

/**
 * Checks what the command saw (`seen`) and what the runner reported (`stderr`).
 * @returns the mirror's keys the command kept.
 * @throws Error saying what leaked, went missing or was misreported.
 */
function checkRunnerOutput(out: { mirrorKeys: string[]; seen: string[]; stderr: string }): string[] {
  const leaked = out.seen.filter((k) => TF_OR_KUBE.test(k));
  if (leaked.length) throw new Error(`the command still saw ${leaked.join(', ')}`);
  const kept = out.mirrorKeys.filter((k) => !TF_OR_KUBE.test(k));
  const missing = kept.filter((k) => !out.seen.includes(k));
  if (missing.length) throw new Error(`the command lost ${missing.join(', ')}`);
  const line = JSON.parse(out.stderr.split('\n').find((l) => l.includes('environment filtered')) ?? '{}') as {
    removed?: string[];
  };
  if (JSON.stringify(line.removed) !== JSON.stringify(RUNNER_REMOVES))
    throw new Error(
      `runner reported removed=${JSON.stringify(line.removed)}, expected ${JSON.stringify(RUNNER_REMOVES)}`,
    );
  return kept;
}

async function narrowingRevokesTeamB(d: Demo): Promise<string> {
  // identity-status may write the status between the read and the write: read again.
  await retryOnConflict(async () => {
    const cur = await readIdentity(d, 'aws-prod');
    return identities(d).replace({ ...cur, spec: { ...cur.spec, allowedNamespaces: { list: ['team-a'] } } });
  });
  await eventually(
    'the team-b mirror to be deleted',
    async () => (await readMirror(d, 'team-b', 'aws-prod')) === undefined,
  );
  const staging = { kind: 'TerraformCluster', metadata: { namespace: 'team-b', name: 'staging' } } as Consumer;
  await eventually('team-b/staging IdentityAllowed=False', async () => {
    const o = await readConsumer(d, staging);
    return (
      hasCondition(o, { type: 'IdentityAllowed', status: 'False', reason: 'NamespaceNotAllowed' }) &&
      !hasCondition(o, { type: 'CredentialsMirrored', status: 'True' })
    );
  });
  if (!(await readMirror(d, 'team-a', 'aws-prod'))) throw new Error('team-a lost its mirror too');
  return 'team-b/captf-creds-aws-prod gone; team-a keeps its mirror';
}

async function webhookDeniesAlice(d: Demo): Promise<string> {
  // examples/40-tenant-rbac.yaml lets the group "tenants" create identities.
  const aliceKc = loadKubeConfig(await d.sys.controlPlane!.userKubeConfig('alice', ['tenants']));
  const alice = identities({ custom: aliceKc.makeApiClient(CustomObjectsApi) });
  const canRead = await aliceKc
    .makeApiClient(CoreV1Api)
    .readNamespacedSecret(SOURCE)
    .then(
      () => true,
      () => false,
    );
  if (canRead) throw new Error('alice can read the source Secret; the step would prove nothing');
  const body = {
    metadata: { name: 'alice-borrows-aws' },
    spec: { secretRef: SOURCE, allowedNamespaces: { list: ['team-b'] } },
  };
  const denial = await eventually(
    'the webhook to deny alice',
    async () => {
      try {
        await alice.create(body);
      } catch (err) {
        // The API server's own text, as kubectl prints it: the demo acts as a person at a
        // terminal (a function never shows it, SPEC §15).
        const msg = untrustedServerMessage(err);
        if (/denied the request/.test(msg)) return msg;
        throw err; // e.g. RBAC not yet effective: try again
      }
      await identities(d).delete({ name: 'alice-borrows-aws' });
      throw new Error('alice was allowed to create an identity on a Secret she cannot read');
    },
    30_000,
  );
  return shorten(denial);
}

async function deletingInUseIdentityRefused(d: Demo): Promise<string> {
  try {
    await identities(d).delete({ name: 'gcp-dev' });
  } catch (err) {
    const msg = untrustedServerMessage(err);
    if (!/denied the request/.test(msg)) throw err;
    return shorten(msg);
  }
  throw new Error('gcp-dev was deleted while team-c used it');
}

async function deletingUnusedIdentityAllowed(d: Demo): Promise<string> {
  for (const c of d.consumers.filter((x) => x.spec?.identityRef?.name === 'gcp-dev')) {
    await consumersLike(d, c).delete({ namespace: c.metadata.namespace!, name: c.metadata.name! });
  }
  await eventually(
    'the team-c mirror to be gone',
    async () => (await readMirror(d, 'team-c', 'gcp-dev')) === undefined,
  );
  await d.sys.broker!.ping('status');
  await eventually(
    'gcp-dev status.namespaces to be empty',
    async () => ((await readIdentity(d, 'gcp-dev')).status?.namespaces ?? []).length === 0,
  );
  await identities(d).delete({ name: 'gcp-dev' });
  await eventually('gcp-dev to be gone', async () =>
    readIdentity(d, 'gcp-dev').then(
      () => false,
      (e: unknown) => isNotFound(e),
    ),
  );
  return 'gcp-dev deleted';
}

async function noCredentialInOutput(d: Demo): Promise<string> {
  const secrets = new Set<string>();
  for (const o of loadExamples()) {
    for (const v of Object.values((o as { stringData?: Record<string, string> }).stringData ?? {})) secrets.add(v);
  }
  const src = await d.core.readNamespacedSecret(SOURCE);
  for (const v of Object.values(src.data ?? {})) secrets.add(Buffer.from(v, 'base64').toString('utf8'));
  const hits = raw.filter((l) => [...secrets].some((v) => v.length >= 8 && l.includes(v)));
  if (hits.length) throw new Error(`${hits.length} line(s) contain a credential value`);
  return `${raw.length} lines scanned for ${secrets.size} values`;
}
