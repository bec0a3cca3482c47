// Wrapper module of the daemonless image builder (scripts/image/): main.go writes an OCI image
// layout tar from staged folders with go-containerregistry; pause/ is the pod sandbox's process.
module captf.local/tools/image

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	github.com/klauspost/compress v1.20.4
)

require (
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
