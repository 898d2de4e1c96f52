// Package pipelines holds the pipelines that ship with handoff. Binaries embed them, so
// `handoff up` and the coordinator can load them without files on disk:
//
//	ps, err := pipeline.LoadAll(pipelines.FS)
package pipelines

import "embed"

// FS holds every shipped pipeline file (*.yaml) at its root.
//
//go:embed *.yaml
var FS embed.FS
