/**
 * Turns the functions' JSON log lines into one readable line per thing that happened, for
 * `npm start` (SPEC §14): a consumer's outcome changed, an identity's status was written,
 * a request was denied, something went wrong. Repeats (a reconcile that found everything
 * as it was) become debug lines. Only named fields are printed, never whole log objects, so
 * nothing the functions did not choose to say can appear.
 */
import { jsonObject } from '../../functions/lib/json.ts';

/** One printable line; `debug` lines are shown only with `--debug`. */
export interface Printed {
  debug: boolean;
  /** Column 2: the function or part (`mirror-sync`, `admission`, `mirror`, …). */
  component: string;
  /** Column 3: the object, e.g. `team-a/prod` or an identity name. */
  subject: string;
  text: string;
}

/** Formats a {@link Printed} as `HH:MM:SS  component  subject  text`. */
export function formatLine(p: Printed, now = new Date()): string {
  const t = now.toISOString().slice(11, 19);
  return `${t}  ${p.component.padEnd(15)} ${p.subject.padEnd(30)} ${p.text}`.trimEnd();
}

type Json = Record<string, unknown>;
const str = (v: unknown): string =>
  typeof v === 'string' ? v : v === undefined || v === null ? '' : JSON.stringify(v);

/** The summary fields of mirror-sync's `resync` line, in print order. */
const RESYNC_FIELDS = [
  'consumers',
  'mirrors',
  'keys',
  'changed',
  'orphanedMirrorsDeleted',
  'revoked',
  'sent',
  'failed',
  'needRetry',
  'durationMs',
];
/** The summary fields of identity-status's `refresh done` line, in print order. */
const REFRESH_FIELDS = ['trigger', 'refreshed', 'written', 'gone', 'failed', 'durationMs'];

/** identity-status wrote (or found unchanged) an identity's status; unchanged ones are debug. */
function identityRefreshed(component: string, j: Json): Printed {
  const changed = Array.isArray(j.changed) ? (j.changed as unknown[]).map(str) : [];
  const ns = Array.isArray(j.namespaces) ? (j.namespaces as unknown[]).map(str).join(',') : '';
  return {
    debug: changed.length === 0,
    component,
    subject: `identity ${str(j.identity)}`,
    text: `Ready=${str(j.ready)} (${str(j.reason)}), in use in [${ns}]${changed.length ? `; wrote ${changed.join(' and ')}` : ''}`,
  };
}

/** The admission function's decision: a denial is shown, an allowed request is debug. */
function reviewed(component: string, j: Json): Printed {
  const who = `${str(j.operation).toLowerCase()} by ${str(j.user)}${j.dryRun ? ' (dry run)' : ''}`;
  const subject = `identity ${str(j.name)}`;
  if (j.allowed === false) return { debug: false, component, subject, text: `DENIED ${who}: ${str(j.denial)}` };
  return { debug: true, component, subject, text: `allowed ${who} (${str(j.why)})` };
}

/** Any other line: warnings and errors are shown with their named fields, the rest is debug. */
function otherLine(component: string, j: Json, { level, message }: { level: string; message: string }): Printed {
  const warn = level === 'warn' || level === 'error';
  const extra = summary(j, ['error', 'errors', 'object', 'identity', 'denial', 'reason'], ', ');
  return {
    debug: !warn,
    component,
    subject: '',
    text: `${warn ? `${level}: ` : ''}${message}${extra && ` (${extra})`}`,
  };
}

/**
 * A dead letter (functions/dead-letters) as a warning line: the event's type and object, which
 * Trigger gave up on which function, with Knative's `knativeerrorcode` and the function's own `error`.
 */
function deadLetter(component: string, j: Json): Printed {
  const by = j.trigger ? ` by Trigger ${str(j.trigger)}` : '';
  const target = str(j.for) !== 'other' ? str(j.for) : str(j.destination);
  const why = j.error ? `: ${str(j.error)}` : '';
  return {
    debug: false,
    component,
    subject: str(j.about),
    text: `warn: ${str(j.type)} given up${by}${target && ` to ${target}`} (knativeerrorcode=${str(j.code) || 'none'})${why}`,
  };
}

/**
 * Reads the log lines of the functions and remembers, per consumer, the last outcome seen,
 * so a line is printed only when it changed.
 */
export class LogPrinter {
  private readonly outcomes = new Map<string, string>();

  /**
   * @param component the function whose stdout/stderr the line came from.
   * @param raw one line (JSON from winston, or plain text such as a crash message).
   * @returns the line to print, or undefined for an empty line.
   */
  line(component: string, raw: string): Printed | undefined {
    const trimmed = raw.trim();
    if (!trimmed) return undefined;
    const j = jsonObject(trimmed);
    if (!j) return { debug: false, component, subject: '', text: trimmed };
    const level = str(j.level);
    const message = str(j.message);
    switch (message) {
      case 'reconcile':
        return this.reconcile(component, j, level);
      case 'identity refreshed':
        return identityRefreshed(component, j);
      case 'reviewed':
        return reviewed(component, j);
      case 'resync':
        return { debug: true, component, subject: 'resync', text: summary(j, RESYNC_FIELDS) };
      case 'refresh done':
        return { debug: true, component, subject: 'refresh', text: summary(j, REFRESH_FIELDS) };
      case 'dead letter':
        return deadLetter(component, j);
      default:
        return otherLine(component, j, { level, message });
    }
  }

  private reconcile(component: string, j: Json, level: string): Printed {
    const object = str(j.object);
    const key = `${str(j.kind)} ${object}`;
    const outcome = str(j.outcome);
    const signature = [outcome, str(j.reason), str(j.identity), str(j.mirror)].join('|');
    const repeated = this.outcomes.get(key) === signature;
    if (outcome === 'gone') this.outcomes.delete(key);
    else this.outcomes.set(key, signature);
    const detail = str(j.detail);
    let text: string;
    switch (outcome) {
      case 'mirrored':
        text = `mirrored (${str(j.mirror)} of identity ${str(j.identity)})`;
        break;
      case 'gone':
        text = `deleted; ${detail.replace(/^object is gone; /, '')}`;
        break;
      case 'no-identity-ref':
        text = 'no identityRef: nothing mirrored';
        break;
      default:
        text = `${str(j.reason)}: ${detail}${j.retry ? ' (will retry)' : ''}`;
    }
    return { debug: repeated && level !== 'warn', component, subject: key, text };
  }
}

/** `key=value` of each of `keys` that `j` has, joined by `separator`. */
function summary(j: Json, keys: string[], separator = ' '): string {
  return keys
    .filter((k) => j[k] !== undefined)
    .map((k) => `${k}=${str(j[k])}`)
    .join(separator);
}

/** What a mirror watch saw, for {@link describeMirrorChange}. */
export interface MirrorView {
  namespace: string;
  name: string;
  identity: string;
  /** `<Kind>/<name>` of each owner reference. */
  owners: string[];
  /** The source-hash annotation; compared, never printed. */
  hash: string;
}

/** At most `max` names, then `and N more`: a line stays short on a mirror with hundreds of owners. */
function someOf(names: readonly string[], max = 3): string {
  return names.length <= max ? names.join(', ') : `${names.slice(0, max).join(', ')} and ${names.length - max} more`;
}

const plural = (n: number, word: string): string => `${n} ${word}${n === 1 ? '' : 's'}`;

/** What changed in the owner list: `owners +A, B −C (now N)`; undefined when nothing did. */
function ownerChange(now: readonly string[], before: readonly string[]): string | undefined {
  const had = new Set(before);
  const has = new Set(now);
  const added = now.filter((o) => !had.has(o));
  const removed = before.filter((o) => !has.has(o));
  if (!added.length && !removed.length) return undefined;
  const parts = [...(added.length ? [`+${someOf(added)}`] : []), ...(removed.length ? [`−${someOf(removed)}`] : [])];
  return `owners ${parts.join(' ')} (now ${plural(now.length, 'owner')})`;
}

/**
 * One line about a mirror Secret that was created, updated or deleted (from a metadata
 * watch of Secrets labelled `captf.io/mirrored=true`). Says what changed: owners added and
 * removed (a few names and the new count, never the whole list), or the data (by a
 * different source-hash annotation, which is compared but never shown).
 * @returns undefined when nothing a reader cares about changed.
 */
export function describeMirrorChange(
  verb: 'add' | 'update' | 'delete',
  now: MirrorView,
  before?: MirrorView,
): Printed | undefined {
  const subject = `${now.namespace}/${now.name}`;
  if (verb === 'add')
    return {
      debug: false,
      component: 'mirror',
      subject,
      text: `created for identity ${now.identity}; ${plural(now.owners.length, 'owner')}${now.owners.length ? `: ${someOf(now.owners)}` : ''}`,
    };
  if (verb === 'delete')
    return { debug: false, component: 'mirror', subject, text: `deleted (identity ${now.identity})` };
  const what: string[] = [];
  if (before && before.hash !== now.hash) what.push('data replaced from the rotated source');
  const owners = ownerChange(now.owners, before?.owners ?? []);
  if (owners) what.push(owners);
  if (!what.length) return undefined;
  return { debug: false, component: 'mirror', subject, text: `updated; ${what.join('; ')}` };
}

/** Levels of Knative's log lines (the adapter's, the data plane's) that are printed without `--debug`. */
const KNATIVE_SHOWN = new Set(['warn', 'warning', 'error', 'fatal', 'panic', 'dpanic']);
/**
 * Warnings the adapter prints at every start with the local configuration, which a user can
 * do nothing about (no sink timeout is configured, as on a cluster by default).
 */
const ADAPTER_BENIGN = [/^Sink timeout configuration is invalid/];
/**
 * Errors and warnings the data plane's processes (ingress, filter, dispatcher) print at every
 * start with the local configuration, none of which a user can act on:
 * - the OIDC verifier cannot reach `kubernetes.default.svc` for the cluster's OIDC discovery
 *   (a process outside a pod has no such name). OIDC is off — the system namespace's
 *   `config-features` sets only `delivery-retryafter`, so upstream's default
 *   `authentication-oidc: disabled` holds — and
 *   upstream's own message says to ignore it then (knative.dev/eventing pkg/auth verifier.go,
 *   once at start and once per config update);
 * - `secrets "<component>-server-tls" not found`: the certificates of the HTTPS servers,
 *   which serve nothing while `transport-encryption` is off (upstream's default; in a cluster
 *   cert-manager issues them only when it is turned on), pkg/eventingtls.
 * Anything else at warning level or above is printed.
 */
const DATA_PLANE_BENIGN = [
  /^could not initialize provider( after config update)?\. You can ignore this message, when the authentication-oidc feature is disabled/,
  /^secrets "[a-z-]+-server-tls" not found$/,
  // With --observability: the last push, cut short as the process stops (its spans up to then were sent).
  /^Error flushing (metrics|traces) \(context canceled\)$/,
];
/** klog's one-letter severities (`E1130 16:45:36.43 …`). */
const KLOG_LEVELS: Record<string, string> = { I: 'info', W: 'warning', E: 'error', F: 'fatal' };

/**
 * One line of a Knative process. Its JSON lines name the level `severity` and the text
 * `message` (Knative's zap configuration), some `level`/`msg` (zap's defaults, before the
 * logging config is read), the Kubernetes client inside it writes klog lines, and Go's `log`
 * plain ones (taken as info); warnings and errors are shown unless `benign` matches their
 * text, the rest is debug. Only the message and the `error` field are printed: never a whole
 * log object.
 */
function knativeLine(
  where: { component: string; subject: string },
  raw: string,
  benign: readonly RegExp[],
): Printed | undefined {
  const line = raw.trim();
  if (!line) return undefined;
  const { level, text } = levelAndText(line);
  const shown = KNATIVE_SHOWN.has(level) && !benign.some((re) => re.test(text));
  return { ...where, debug: !shown, text: shown ? `${level === 'warning' ? 'warn' : level}: ${text}` : text };
}

/**
 * One line of Knative's ApiServerSource adapter ({@link knativeLine}).
 * @param name the ApiServerSource the adapter runs for.
 */
export function adapterLine(name: string, raw: string): Printed | undefined {
  return knativeLine({ component: 'events', subject: `adapter ${name}` }, raw, ADAPTER_BENIGN);
}

/**
 * One line of a process of Knative's Broker data plane ({@link knativeLine}), without the
 * known start-up noise of the local configuration.
 * @param binary the process: `broker-ingress`, `broker-filter`, `imc-dispatcher` or `mtping`.
 */
export function dataPlaneLine(binary: string, raw: string): Printed | undefined {
  return knativeLine({ component: 'events', subject: binary }, raw, DATA_PLANE_BENIGN);
}

/** The level (lower case) and text of one Knative line: zap JSON, klog, or plain text (info). */
function levelAndText(line: string): { level: string; text: string } {
  const j = jsonObject(line);
  if (!j) return { level: /^[IWEF]\d{4} /.test(line) ? KLOG_LEVELS[line[0]!]! : 'info', text: line };
  const message = str(j.message ?? j.msg ?? line);
  return {
    level: str(j.severity ?? j.level ?? 'info').toLowerCase(),
    text: j.error ? `${message} (${str(j.error)})` : message,
  };
}

/** Prints a line to stdout unless it is debug and debug is off. */
export function printer(debug: boolean): (p: Printed) => void {
  return (p) => {
    if (p.debug && !debug) return;
    process.stdout.write(formatLine(p) + '\n');
  };
}
