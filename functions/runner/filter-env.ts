/**
 * SPEC §11: which environment variables `captf-runner` removes before it starts the command.
 * Pure.
 *
 * Rule: a variable is removed when its name starts with `TF_` or `KUBE_`, compared without
 * regard to ASCII case (so `tf_var_x` and `Kube_Config` go too), unless the name is exactly
 * one of {@link KEPT_NAMES}. Why case-insensitive: Terraform itself only reads upper-case
 * `TF_*`, but a credential key is copied verbatim from the operator's Secret, and other
 * tools (or a case-insensitive platform) may honour a lower-case spelling; removing it costs
 * nothing because every key stays readable as a file. The exceptions are exact, upper-case
 * names, because those are the ones the Job sets itself.
 *
 * Names that are not POSIX identifiers (`aws.key`, `1token`, `my-key`) are judged by the
 * same rule and otherwise left alone: since Kubernetes 1.34 the kubelet passes every Secret
 * key through `envFrom` (any printable ASCII except `=`), so such names do reach the process.
 */

/** Name prefixes whose variables are removed (ASCII case-insensitive). */
export const REMOVED_PREFIXES: readonly string[] = ['TF_', 'KUBE_'];

/** Names kept although they match a prefix: the Job sets these itself (exact, case-sensitive). */
export const KEPT_NAMES: ReadonlySet<string> = new Set(['TF_IN_AUTOMATION', 'TF_INPUT', 'KUBE_NAMESPACE']);

// Without the `u` flag, /i folds ASCII letters only: the Kelvin sign (U+212A) does not match `K`.
const REMOVED = /^(?:TF|KUBE)_/i;

/**
 * Does the runner remove the variable called `name`?
 * @param name an environment variable name as the process received it.
 * @returns true when `name` starts with `TF_` or `KUBE_` in any ASCII case and is not in {@link KEPT_NAMES}.
 */
export function isRemoved(name: string): boolean {
  return REMOVED.test(name) && !KEPT_NAMES.has(name);
}

/**
 * Splits an environment into what the command receives and the names removed.
 * @param env name → value (e.g. `process.env`; undefined values are dropped).
 * @returns `{ env, removed }`: the command's environment, and the removed names sorted by
 *   code unit (names only; values never leave this function).
 */
export function filterEnvironment(env: Readonly<Record<string, string | undefined>>): {
  env: Record<string, string>;
  removed: string[];
} {
  const kept: Record<string, string> = {};
  const removed: string[] = [];
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) continue;
    if (isRemoved(name)) removed.push(name);
    else kept[name] = value;
  }
  removed.sort();
  return { env: kept, removed };
}
