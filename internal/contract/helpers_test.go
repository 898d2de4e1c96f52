package contract

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	sjs "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/handoffhq/handoff/gen/jsonschema"
)

// fixture is one file in testdata/packages with the verdict it must get.
type fixture struct {
	name    string // file name in testdata/packages
	version string // the version it declares; "" for an unknown one
	valid   bool   // expected verdict under a validator accepting V1 and V2
}

var fixtures = []fixture{
	{"valid.json", V1, true},
	{"judge_failed.json", V1, true},
	{"duplicate_delivery.json", V1, true},
	{"empty_budget.json", V1, true},
	{"unknown_version.json", "", false},
	{"valid_v2.json", V2, true},
}

// repoRoot walks up from the test's working directory to the folder holding go.mod.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("go.mod not found above the test's working directory")
		}
		dir = parent
	}
}

func readFixture(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(tb), "testdata", "packages", name))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func newValidator(tb testing.TB, accept ...string) *Validator {
	tb.Helper()
	v, err := NewValidator(accept...)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

var (
	schemasOnce sync.Once
	schemas     map[string]*sjs.Schema
	schemasErr  error
)

// packageSchema returns the committed Draft 2020-12 JSON Schema of version's HandoffPackage,
// compiled from the embedded bundle (the same bytes `handoff schema` prints).
func packageSchema(tb testing.TB, version string) *sjs.Schema {
	tb.Helper()
	schemasOnce.Do(func() {
		schemas = map[string]*sjs.Schema{}
		for _, ver := range []string{V1, V2} {
			name := ver + ".HandoffPackage.schema.bundle.json"
			b, err := jsonschema.FS.ReadFile(name)
			if err != nil {
				schemasErr = err
				return
			}
			doc, err := sjs.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				schemasErr = err
				return
			}
			c := sjs.NewCompiler()
			url := "https://schemas.handoff.invalid/" + name
			if err := c.AddResource(url, doc); err != nil {
				schemasErr = err
				return
			}
			sch, err := c.Compile(url)
			if err != nil {
				schemasErr = err
				return
			}
			schemas[ver] = sch
		}
	})
	if schemasErr != nil {
		tb.Fatal(schemasErr)
	}
	return schemas[version]
}

// schemaCheck validates data against version's JSON Schema; nil means valid.
func schemaCheck(tb testing.TB, version string, data []byte) error {
	tb.Helper()
	inst, err := sjs.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return packageSchema(tb, version).Validate(inst)
}

// declaredVersion reads the "schema" member of a JSON package ("" when absent or not a string).
func declaredVersion(data []byte) string {
	var top struct {
		Schema any `json:"schema"`
	}
	_ = json.Unmarshal(data, &top)
	s, _ := top.Schema.(string)
	return s
}
