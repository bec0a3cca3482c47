/**
 * TypeScript shapes of the project's API objects (SPEC §1, §16). They mirror the CRDs in
 * manifests/crds/ and are the only place these shapes are declared.
 */

/** API group of every kind this project reads or writes (SPEC §1). */
export const GROUP = 'infrastructure.cluster.x-k8s.io';
/** API version served and stored by the project's CRDs (SPEC §1). */
export const VERSION = 'v1beta2';
/** `apiVersion` string of the project's kinds. */
export const API_VERSION = `${GROUP}/${VERSION}`;
/** Kind of the cluster-scoped identity (SPEC §1). */
export const IDENTITY_KIND = 'TerraformClusterIdentity';
/** Resource (plural) of the identity. */
export const IDENTITY_PLURAL = 'terraformclusteridentities';
/** Field manager for every server-side apply this project makes (SPEC §4). */
export const FIELD_MANAGER = 'captf-credentials';

/** One `metav1.ManagedFieldsEntry`: who owns which fields (server-side apply). */
export interface ManagedFieldsEntry {
  manager?: string;
  operation?: string;
  subresource?: string;
  /** The owned field set (`f:<field>`, `k:<list key as JSON>`), as the API server sends it. */
  fieldsV1?: unknown;
}

/** Minimal object metadata this project reads; a subset of `metav1.ObjectMeta`. */
export interface ObjectMeta {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  deletionTimestamp?: string | Date;
  finalizers?: string[];
  ownerReferences?: OwnerReference[];
  managedFields?: ManagedFieldsEntry[];
}

/** `metav1.OwnerReference` as the mirror carries it (SPEC §3). */
export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

/** One `matchExpressions` entry of a `metav1.LabelSelector`. */
export interface LabelSelectorRequirement {
  key: string;
  operator: string;
  values?: string[];
}

/** `metav1.LabelSelector`: `matchLabels` and `matchExpressions` are ANDed. */
export interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: LabelSelectorRequirement[];
}

/**
 * `spec.allowedNamespaces` of an identity (SPEC §2). Absent or null allows nothing; `{}` is
 * invalid; `list` and `selector` are a union.
 */
export interface AllowedNamespaces {
  list?: string[];
  selector?: LabelSelector;
}

/** Reference to the operator's source Secret; both fields required (SPEC §1). */
export interface SecretRef {
  name: string;
  namespace: string;
}

/** `metav1.Condition` (SPEC §16). `lastTransitionTime` is RFC 3339. */
export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

/** TerraformClusterIdentity (cluster-scoped, SPEC §1). */
export interface TerraformClusterIdentity {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  spec: {
    secretRef: SecretRef;
    allowedNamespaces?: AllowedNamespaces | null;
  };
  status?: {
    conditions?: Condition[];
    namespaces?: string[];
  };
}

/** Any consumer ("Terraform*" object, SPEC §1): namespaced, optionally names an identity. */
export interface Consumer {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  spec?: { identityRef?: { name?: string } | null; [key: string]: unknown };
  status?: { conditions?: Condition[]; [key: string]: unknown };
}

/** A kind served through the custom-object API: group/version/kind plus its plural (resource). */
export interface ResourceKind {
  group: string;
  version: string;
  kind: string;
  plural: string;
}

/** A consumer kind from configuration (SPEC §1), with its scope once discovery has told it. */
export interface ConsumerKind extends ResourceKind {
  /**
   * False for a cluster-scoped kind (lib/consumers.ts `discoverConsumerKinds`, at start);
   * absent or true: namespaced, as the shipped kinds are. A cluster-scoped kind is never
   * listed in a namespace.
   */
  namespaced?: boolean;
}

/** The identity's kind and resource (SPEC §1). */
export const IDENTITY_RESOURCE: ResourceKind = Object.freeze({
  group: GROUP,
  version: VERSION,
  kind: IDENTITY_KIND,
  plural: IDENTITY_PLURAL,
});

/** The shipped TerraformCluster consumer kind. */
export const TERRAFORM_CLUSTER: ConsumerKind = Object.freeze({
  group: GROUP,
  version: VERSION,
  kind: 'TerraformCluster',
  plural: 'terraformclusters',
});
/** The shipped TerraformMachine consumer kind. */
export const TERRAFORM_MACHINE: ConsumerKind = Object.freeze({
  group: GROUP,
  version: VERSION,
  kind: 'TerraformMachine',
  plural: 'terraformmachines',
});

/** The two consumer kinds the project ships CRDs for (SPEC §1). */
export const DEFAULT_CONSUMER_KINDS: readonly ConsumerKind[] = Object.freeze([TERRAFORM_CLUSTER, TERRAFORM_MACHINE]);

/** Field path of the CRD selectable field used to find an identity's consumers (SPEC §1). */
export const IDENTITY_REF_FIELD = 'spec.identityRef.name';

/**
 * Selectable fields of the identity CRD (manifests/crds): which identities name a Secret as
 * their source is one field-selected list (SPEC §3: a source is never a mirror).
 */
export const SECRET_REF_FIELDS = { namespace: 'spec.secretRef.namespace', name: 'spec.secretRef.name' } as const;
