// Pins the modules whose source trees ship the third-party CRDs the manifests are
// validated against (Knative Serving and Eventing 1.22, cert-manager, prometheus-operator's
// PrometheusRule). Nothing is built:
// scripts/controlplane/crds.ts runs `go mod download -json <module>` here and reads the YAML files
// from the module cache. Do not `go mod tidy` this module (it would drop the requires,
// as nothing imports them); bump a version by editing its line and running
// `go mod download <module>`.
module captf.local/controlplane/crds

go 1.26.0

require (
	github.com/cert-manager/cert-manager v1.21.2
	github.com/prometheus-operator/prometheus-operator v0.90.1
	knative.dev/eventing v0.49.2
	knative.dev/serving v0.49.1
)
