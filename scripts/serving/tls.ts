/**
 * Knative's cluster-local TLS on the test node, set up as a platform team would: a CA
 * ClusterIssuer for cluster-local certificates (cert-manager's bootstrap: a self-signed
 * ClusterIssuer issues the CA Certificate, a CA ClusterIssuer signs with it), named in
 * `config-certmanager` as `clusterLocalIssuerRef`, and the CA published as Eventing's trust bundle
 * so the Broker's filter can deliver to the now-https addresses. Serving's controller turns each
 * route's KCertificate into a cert-manager Certificate from that issuer; the cert-manager
 * stand-in (scripts/certmanager/) issues it, and Traefik serves it by SNI.
 */
import type { KubernetesObject } from '@kubernetes/client-node';
import { CLUSTER_RESOURCE_NAMESPACE } from '../certmanager/decide.ts';

/** The CA ClusterIssuer of cluster-local certificates (what `clusterLocalIssuerRef` names). */
export const CLUSTER_LOCAL_ISSUER = 'knative-cluster-local';
/** The Secret of its CA, in cert-manager's namespace. */
const CA_SECRET = 'knative-cluster-local-ca';
/** Eventing's namespace, where its data plane looks for trust bundles (`eventingtls`, trust_bundle.go). */
const EVENTING_NAMESPACE = 'knative-eventing';

/** `config-network` and `config-certmanager` entries that turn cluster-local TLS on. */
export const CLUSTER_LOCAL_TLS = {
  network: { 'cluster-local-domain-tls': 'Enabled' },
  certmanager: { clusterLocalIssuerRef: `kind: ClusterIssuer\nname: ${CLUSTER_LOCAL_ISSUER}\n` },
} as const;

/** Where the CA's certificate can be read once issued. */
export const CLUSTER_LOCAL_CA = { namespace: CLUSTER_RESOURCE_NAMESPACE, secret: CA_SECRET } as const;

/** cert-manager's namespace, the self-signed and CA ClusterIssuers and the CA Certificate. Pure. */
export function clusterLocalIssuers(): KubernetesObject[] {
  const selfSigned = 'knative-selfsigned';
  return [
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: CLUSTER_RESOURCE_NAMESPACE } },
    {
      apiVersion: 'cert-manager.io/v1',
      kind: 'ClusterIssuer',
      metadata: { name: selfSigned },
      spec: { selfSigned: {} },
    },
    {
      apiVersion: 'cert-manager.io/v1',
      kind: 'Certificate',
      metadata: { name: CA_SECRET, namespace: CLUSTER_RESOURCE_NAMESPACE },
      spec: {
        isCA: true,
        commonName: 'knative-cluster-local-ca',
        secretName: CA_SECRET,
        duration: '87600h',
        privateKey: { algorithm: 'ECDSA', size: 256 },
        issuerRef: { group: 'cert-manager.io', kind: 'ClusterIssuer', name: selfSigned },
      },
    },
    {
      apiVersion: 'cert-manager.io/v1',
      kind: 'ClusterIssuer',
      metadata: { name: CLUSTER_LOCAL_ISSUER },
      spec: { ca: { secretName: CA_SECRET } },
    },
  ] as KubernetesObject[];
}

/** Eventing's trust bundle: a labelled ConfigMap in its namespace holding the CA (and its namespace). Pure. */
export function trustBundle(caPem: string): KubernetesObject[] {
  return [
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: EVENTING_NAMESPACE } },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: {
        name: 'knative-cluster-local-ca',
        namespace: EVENTING_NAMESPACE,
        labels: { 'networking.knative.dev/trust-bundle': 'true' },
      },
      data: { 'ca.crt': caPem },
    },
  ] as KubernetesObject[];
}
