// Package manifesttest checks the deployment files of handoff: the kustomize overlays in
// deploy/k8s (rendered with kubectl, decoded strictly into the typed Kubernetes API
// structs, then checked for non-root pods, probes, resources, NetworkPolicy reach and the
// pipelines ConfigMap), the Dockerfile's targets, and that the service binaries build
// static.
//
// It is a module of its own so that the Kubernetes API packages never enter the root
// module's dependencies. Run it with:
//
//	cd deploy/k8s/manifesttest && go test ./...
//
// The tests need kubectl on PATH (they skip without it, and fail without it when CI is
// set). TestStaticBinaries builds the four binaries once; -short skips it.
package manifesttest
