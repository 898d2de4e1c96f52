// Package jsonschema embeds the JSON Schemas (Draft 2020-12) that buf generates from
// proto/ into this folder. This file is the one hand-written file under gen/: `make gen`
// deletes and regenerates only the *.json files beside it.
package jsonschema

import "embed"

// FS holds <proto full name>.schema.bundle.json for each generated message.
//
//go:embed *.json
var FS embed.FS
