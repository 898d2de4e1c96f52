package llmagent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// checkJSON checks a JSON output against what the stage declares: valid JSON; when it is
// an object naming its "schema_version", the declared one; and the role's JSON Schema.
func (a *Agent) checkJSON(text string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return fmt.Errorf("the %s artifact is not valid JSON", a.role.Output.SchemaVersion)
	}
	if obj, ok := inst.(map[string]any); ok {
		if v, ok := obj["schema_version"]; ok && v != a.role.Output.SchemaVersion {
			return fmt.Errorf("the artifact says schema_version %v; the stage declares %s", v, a.role.Output.SchemaVersion)
		}
	}
	if a.role.OutputSchema != nil {
		if err := a.role.OutputSchema.Validate(inst); err != nil {
			return fmt.Errorf("the %s artifact does not satisfy its JSON Schema: %s", a.role.Output.SchemaVersion, clip(oneLine(err.Error()), 500))
		}
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// LoadSchema compiles the JSON Schema file at path.
func LoadSchema(path string) (*jsonschema.Schema, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("llmagent: output schema: %w", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("llmagent: output schema %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	url := "file://" + filepath.ToSlash(abs)
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("llmagent: output schema %s: %w", path, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("llmagent: output schema %s: %w", path, err)
	}
	return s, nil
}
