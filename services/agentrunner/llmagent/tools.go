package llmagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Access levels of a tool (as in the pipeline's catalogue).
const (
	AccessRead  = "read"
	AccessWrite = "write"
)

// Error codes the runtime records in tools_tried (ToolAttempt.error_code).
const (
	// CodeNotGranted: the model called a tool that is not on the stage's card. The call is
	// refused (nothing runs) and the model is told so.
	CodeNotGranted = "tool_not_granted"
	// CodeBadArguments: the call's arguments are not a JSON object. The stage fails.
	CodeBadArguments = "bad_tool_arguments"
	// CodeToolError: the tool ran and reported an error; the model sees it and may go on.
	CodeToolError = "tool_error"
	// CodeUnavailable: the tool's server is gone (crashed, refused the connection). The
	// stage fails.
	CodeUnavailable = "tool_unavailable"
	// CodeTimeout: the tool did not answer within Config.ToolTimeout. The stage fails.
	CodeTimeout = "tool_timeout"
	// CodeTransferIgnored: a second transfer in the turn that already made one.
	CodeTransferIgnored = "transfer_ignored"
	// CodeAfterTransfer: a tool call after the turn's transfer, which ended the stage: not
	// run.
	CodeAfterTransfer = "after_transfer"
)

// Stop reasons of a stage that failed in the loop (in the error text, so the rail and a
// person reading the escalation see which limit stopped it).
const (
	StopMaxToolRounds = "max_tool_rounds"
	StopSpendCap      = "spend_cap"
)

// Tool is one tool a stage is granted: its catalogue entry and what runs it.
type Tool struct {
	// Name is the catalogue name ("kb.search"): the card lists it, tools_tried records it.
	Name        string
	Description string
	// Params is the JSON Schema of its arguments (an object schema); nil: no arguments.
	Params map[string]any
	// Access is AccessRead or AccessWrite; System the external system it touches.
	Access, System string
	// Call runs the tool with the model's arguments (a JSON object) and returns the text
	// the model sees. A *ToolError says which error code to record.
	Call func(ctx context.Context, args json.RawMessage) (string, error)
}

// ToolError is a failed tool call with its code (CodeToolError, CodeUnavailable,
// CodeTimeout).
type ToolError struct {
	Code string
	Err  error
}

func (e *ToolError) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *ToolError) Unwrap() error { return e.Err }

// fatal says whether a tool error ends the stage: a tool that is gone or hangs is not
// something the model can work around, and the runtime never guesses its answer.
func fatal(code string) bool { return code == CodeUnavailable || code == CodeTimeout }

// wireName is a tool's name as the model sees it: OpenAI function names allow only
// [A-Za-z0-9_-], so "kb.search" is offered as "kb_search".
func wireName(name string) string { return strings.ReplaceAll(name, ".", "_") }

// TransferPrefix starts the name of every handoff tool: transfer_to_<route>.
const TransferPrefix = "transfer_to_"

var wireRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// grant checks the role's tools against its card and its kind, and returns them by the
// name the model sees. A judge never holds a write tool, nor does any stage that is not
// its system's writer: such a role is refused, so the runner never serves it.
func grant(role *Role) (map[string]*Tool, error) {
	offer := map[string]*Tool{}
	var names []string
	for i := range role.Tools {
		t := &role.Tools[i]
		switch {
		case t.Name == "" || t.Call == nil:
			return nil, fmt.Errorf("llmagent: role %s: tool %d has no name or no implementation", role.Card.Name, i)
		case t.Access != AccessRead && t.Access != AccessWrite:
			return nil, fmt.Errorf("llmagent: role %s: tool %s has access %q: want read or write", role.Card.Name, t.Name, t.Access)
		case t.Access == AccessWrite && role.Judge:
			return nil, fmt.Errorf("llmagent: role %s is a judge and holds write tool %s (system %s): a judge holds no write tools", role.Card.Name, t.Name, t.System)
		case t.Access == AccessWrite && !role.Writer:
			return nil, fmt.Errorf("llmagent: role %s is not the writer of system %s and must not hold its write tool %s", role.Card.Name, t.System, t.Name)
		case strings.HasPrefix(t.Name, TransferPrefix):
			return nil, fmt.Errorf("llmagent: role %s: tool name %s is reserved for handoffs", role.Card.Name, t.Name)
		}
		w := wireName(t.Name)
		if !wireRE.MatchString(w) {
			return nil, fmt.Errorf("llmagent: role %s: tool name %q cannot be offered to a model (letters, digits, '_', '-', '.'; at most 64)", role.Card.Name, t.Name)
		}
		if prev, dup := offer[w]; dup {
			return nil, fmt.Errorf("llmagent: role %s: tools %s and %s have the same name for the model (%s)", role.Card.Name, prev.Name, t.Name, w)
		}
		offer[w] = t
		names = append(names, t.Name)
	}
	if len(role.Card.Tools) == 0 {
		role.Card.Tools = names
	}
	for _, n := range role.Card.Tools {
		if !slices.Contains(names, n) {
			return nil, fmt.Errorf("llmagent: role %s: the card lists tool %s but no tool server provides it", role.Card.Name, n)
		}
	}
	for _, n := range names {
		if !slices.Contains(role.Card.Tools, n) {
			return nil, fmt.Errorf("llmagent: role %s: tool %s is not on the card", role.Card.Name, n)
		}
	}
	return offer, nil
}

// transferArgs is the typed payload of a transfer_to_* call.
type transferArgs struct {
	Reason   string `json:"reason"`
	Priority string `json:"priority"`
}

var transferParams = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"reason":   map[string]any{"type": "string", "description": "Why this route, in one sentence."},
		"priority": map[string]any{"type": "string", "enum": []string{"low", "normal", "high", "urgent"}},
	},
	"required":             []string{"reason"},
	"additionalProperties": false,
}

// argsObject checks that a tool call's arguments are one JSON object ("" counts as {}).
func argsObject(args string) (json.RawMessage, error) {
	s := strings.TrimSpace(args)
	if s == "" {
		return json.RawMessage("{}"), nil
	}
	var m map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(s))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("arguments are not a JSON object: %v", err)
	}
	if dec.More() {
		return nil, errors.New("arguments have data after the JSON object")
	}
	return json.RawMessage(s), nil
}

var attemptNameRE = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// attemptName makes a name the model sent fit ToolAttempt.name.
func attemptName(s string) string {
	s = attemptNameRE.ReplaceAllString(s, "_")
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		s = "x" + s
	}
	return clip(s, 128)
}
