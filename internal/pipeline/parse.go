package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/handoffhq/handoff/internal/pii"
)

// position is a 1-based line and column in the source file.
type position struct{ line, col int }

// The fields each mapping may have, in the order the messages list them.
var (
	pipelineFields   = []string{"name", "description", "max_hops", "max_revisions", "max_bounces", "stale_revision", "on_wallet_empty", "escalation", "pii", "mcp_servers", "prices", "tools", "stages"}
	piiFields        = []string{"policy", "patterns"}
	piiPatternFields = []string{"name", "regex"}
	escalationFields = []string{"route", "max_grant", "max_open_escalations", "when_full", "webhook"}
	grantFields      = []string{"hops", "revisions", "usd_micros"}
	toolFields       = []string{"name", "access", "system", "mcp"}
	mcpFields        = []string{"server", "tool"}
	mcpServerFields  = []string{"name", "command", "url"}
	priceFields      = []string{"model", "prompt_micros_per_1k", "completion_micros_per_1k"}
	stageFields      = []string{"name", "agent", "kind", "input", "output", "tools", "criteria", "runner", "revise", "writer", "routes", "next", "rejected_role", "instructions", "max_tool_rounds", "branches", "on_branch_failure", "branch_timeout", "judge", "subjob"}
	routeFields      = []string{"name", "description", "to"}
	outputFields     = []string{"type", "schema_version", "json_schema"}
	writerFields     = []string{"system", "target"}
)

// Parse reads a pipeline file. name is the file name used in problems and as Source.
//
// The error is non-nil only when data is not YAML at all (a *SyntaxError). Everything else
// that is wrong with the file (unknown or mistyped fields, broken lint rules) comes back as
// problems, sorted by position, next to the pipeline as far as it could be read; use
// HasErrors to decide whether it may run.
func Parse(name string, data []byte) (*Pipeline, []Problem, error) {
	p := &Pipeline{Source: name, MaxBounces: DefaultMaxBounces, StaleRevision: StaleRevise, pos: map[string]position{}, bad: map[string]bool{}}
	d := &decoder{p: p, file: name}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.problem(position{1, 1}, "empty-file", "the file is empty: a pipeline needs at least name, max_hops, escalation, tools and stages")
			return p, d.problems, nil
		}
		return nil, nil, syntaxError(name, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		d.problem(pos(&extra), "multiple-documents", "the file holds more than one YAML document ('---'): put one pipeline in each file")
	case !errors.Is(err, io.EOF):
		return nil, nil, syntaxError(name, err)
	}

	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	root = resolve(root)
	p.pos[""] = pos(root)
	if isNull(root) {
		d.problem(pos(root), "empty-file", "the file is empty: a pipeline needs at least name, max_hops, escalation, tools and stages")
		return p, d.problems, nil
	}
	if root.Kind != yaml.MappingNode {
		d.problem(pos(root), "field-type", "a pipeline file must be a YAML mapping with the fields "+strings.Join(pipelineFields, ", "))
		return p, d.problems, nil
	}
	d.pipeline(root)

	problems := append(d.problems, Lint(p)...)
	sortProblems(problems)
	return p, problems, nil
}

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func syntaxError(file string, err error) *SyntaxError {
	msg := err.Error()
	se := &SyntaxError{File: file}
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		se.Line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	se.Msg = "the file is not valid YAML (the error is on this line or in the block that starts here): " + msg
	return se
}

type decoder struct {
	p        *Pipeline
	file     string
	problems []Problem
}

func (d *decoder) problem(at position, rule, msg string) {
	d.problems = append(d.problems, Problem{File: d.file, Line: at.line, Col: at.col, Rule: rule, Message: msg, Severity: SeverityError})
}

// typeProblem reports a field of the wrong YAML kind and marks the path, so Lint does not
// report the same field again as missing.
func (d *decoder) typeProblem(n *yaml.Node, path, msg string) {
	d.p.bad[path] = true
	d.problem(pos(n), "field-type", msg)
}

func (d *decoder) pipeline(root *yaml.Node) {
	p := d.p
	d.mapping(root, "", "the pipeline", pipelineFields, func(key string, v *yaml.Node) {
		switch key {
		case "name":
			p.Name = d.str(v, "name", "name")
		case "description":
			p.Description = d.str(v, "description", "description")
		case "max_hops":
			p.MaxHops = d.int(v, "max_hops", "max_hops")
		case "max_revisions":
			p.MaxRevisions = d.int(v, "max_revisions", "max_revisions")
		case "max_bounces":
			p.MaxBounces = d.int(v, "max_bounces", "max_bounces")
		case "stale_revision":
			p.StaleRevision = d.str(v, "stale_revision", "stale_revision")
		case "on_wallet_empty":
			p.OnWalletEmpty = d.str(v, "on_wallet_empty", "on_wallet_empty")
		case "escalation":
			d.mapping(v, "escalation", "escalation", escalationFields, func(key string, v *yaml.Node) {
				switch key {
				case "route":
					p.Escalation.Route = d.str(v, "escalation.route", "escalation.route")
				case "when_full":
					p.Escalation.WhenFull = d.str(v, "escalation.when_full", "escalation.when_full")
				case "webhook":
					p.Escalation.Webhook = d.str(v, "escalation.webhook", "escalation.webhook")
				case "max_open_escalations":
					p.Escalation.MaxOpen = d.int(v, "escalation.max_open_escalations", "escalation.max_open_escalations")
				case "max_grant":
					g := &p.Escalation.MaxGrant
					d.mapping(v, "escalation.max_grant", "escalation.max_grant", grantFields, func(key string, v *yaml.Node) {
						f := "escalation.max_grant." + key
						switch key {
						case "hops":
							g.Hops = d.int(v, f, f)
						case "revisions":
							g.Revisions = d.int(v, f, f)
						case "usd_micros":
							g.USDMicros = int64(d.int(v, f, f))
						}
					})
				}
			})
		case "tools":
			d.sequence(v, "tools", "tools (the tool catalogue)", func(i int, item *yaml.Node) {
				path := fmt.Sprintf("tools[%d]", i)
				var t Tool
				d.mapping(item, path, fmt.Sprintf("tool %d of the catalogue", i+1), toolFields, func(key string, v *yaml.Node) {
					f := path + "." + key
					switch key {
					case "name":
						t.Name = d.str(v, f, "tool name")
					case "access":
						t.Access = d.str(v, f, "tool access")
					case "system":
						t.System = d.str(v, f, "tool system")
					case "mcp":
						if isNull(v) {
							return
						}
						m := &MCPTool{}
						d.mapping(v, f, fmt.Sprintf("tool %d: mcp", i+1), mcpFields, func(key string, v *yaml.Node) {
							switch key {
							case "server":
								m.Server = d.str(v, f+".server", "mcp.server")
							case "tool":
								m.Tool = d.str(v, f+".tool", "mcp.tool")
							}
						})
						t.MCP = m
					}
				})
				p.Tools = append(p.Tools, t)
			})
		case "prices":
			d.sequence(v, "prices", "prices (the model price table)", func(i int, item *yaml.Node) {
				path := fmt.Sprintf("prices[%d]", i)
				var pr Price
				d.mapping(item, path, fmt.Sprintf("price %d", i+1), priceFields, func(key string, v *yaml.Node) {
					f := path + "." + key
					switch key {
					case "model":
						pr.Model = d.str(v, f, "price model")
					case "prompt_micros_per_1k":
						pr.PromptMicrosPer1K = d.int(v, f, "prompt_micros_per_1k")
					case "completion_micros_per_1k":
						pr.CompletionMicrosPer1K = d.int(v, f, "completion_micros_per_1k")
					}
				})
				p.Prices = append(p.Prices, pr)
			})
		case "mcp_servers":
			d.sequence(v, "mcp_servers", "mcp_servers (the tool servers)", func(i int, item *yaml.Node) {
				path := fmt.Sprintf("mcp_servers[%d]", i)
				var m MCPServer
				d.mapping(item, path, fmt.Sprintf("MCP server %d", i+1), mcpServerFields, func(key string, v *yaml.Node) {
					f := path + "." + key
					switch key {
					case "name":
						m.Name = d.str(v, f, "MCP server name")
					case "command":
						m.Command = d.strings(v, f, "MCP server command", "[ticket-tools, --stdio]")
					case "url":
						m.URL = d.str(v, f, "MCP server url")
					}
				})
				p.MCPServers = append(p.MCPServers, m)
			})
		case "pii":
			d.mapping(v, "pii", "pii", piiFields, func(key string, v *yaml.Node) {
				switch key {
				case "policy":
					p.PII.Policy = d.str(v, "pii.policy", "pii.policy")
				case "patterns":
					d.sequence(v, "pii.patterns", "pii.patterns", func(i int, item *yaml.Node) {
						path := fmt.Sprintf("pii.patterns[%d]", i)
						var pt pii.Pattern
						d.mapping(item, path, fmt.Sprintf("pii pattern %d", i+1), piiPatternFields, func(key string, v *yaml.Node) {
							switch key {
							case "name":
								pt.Name = d.str(v, path+".name", "pii pattern name")
							case "regex":
								pt.Regex = d.str(v, path+".regex", "pii pattern regex")
							}
						})
						p.PII.Patterns = append(p.PII.Patterns, pt)
					})
				}
			})
		case "stages":
			d.sequence(v, "stages", "stages", func(i int, item *yaml.Node) {
				p.Stages = append(p.Stages, d.stage(i, item))
			})
		}
	})
}

func (d *decoder) stage(i int, n *yaml.Node) Stage {
	return d.stageAt(fmt.Sprintf("stages[%d]", i), i, n)
}

// stageAt reads the stage at path (a top-level stage, or one of a parallel branch's).
func (d *decoder) stageAt(path string, i int, n *yaml.Node) Stage {
	s := Stage{Line: pos(n).line}
	what := fmt.Sprintf("stage %d", i+1)
	if name := mappingValue(n, "name"); name != nil && name.Kind == yaml.ScalarNode && name.Value != "" {
		what = fmt.Sprintf("stage %q", name.Value)
	}
	d.mapping(n, path, what, stageFields, func(key string, v *yaml.Node) {
		f := path + "." + key
		switch key {
		case "name":
			s.Name = d.str(v, f, what+": name")
		case "agent":
			s.Agent = d.str(v, f, what+": agent")
		case "kind":
			s.Kind = d.str(v, f, what+": kind")
		case "input":
			s.Input = d.str(v, f, what+": input")
		case "revise":
			// One stage, or a list when several stages feed the judge.
			if rv := resolve(v); rv != nil && rv.Kind == yaml.SequenceNode {
				s.Revisers = d.strings(v, f, what+": revise", "[billing-draft, technical-draft]")
				if len(s.Revisers) > 0 {
					s.Revise = s.Revisers[0]
				}
				return
			}
			s.Revise = d.str(v, f, what+": revise")
		case "next":
			s.Next = d.str(v, f, what+": next")
		case "rejected_role":
			s.RejectedRole = d.str(v, f, what+": rejected_role")
		case "routes":
			d.sequence(v, f, what+": routes", func(j int, item *yaml.Node) {
				rp := fmt.Sprintf("%s[%d]", f, j)
				var r Route
				d.mapping(item, rp, fmt.Sprintf("%s: route %d", what, j+1), routeFields, func(key string, v *yaml.Node) {
					switch key {
					case "name":
						r.Name = d.str(v, rp+".name", what+": route name")
					case "description":
						r.Description = d.str(v, rp+".description", what+": route description")
					case "to":
						r.To = d.str(v, rp+".to", what+": route to")
					}
				})
				s.Routes = append(s.Routes, r)
			})
		case "runner":
			s.Runner = d.str(v, f, what+": runner")
		case "instructions":
			s.Instructions = d.str(v, f, what+": instructions")
		case "max_tool_rounds":
			s.MaxToolRounds = d.int(v, f, what+": max_tool_rounds")
		case "output":
			d.mapping(v, f, what+": output", outputFields, func(key string, v *yaml.Node) {
				switch key {
				case "type":
					s.Output.Type = d.str(v, f+".type", what+": output.type")
				case "schema_version":
					s.Output.SchemaVersion = d.str(v, f+".schema_version", what+": output.schema_version")
				case "json_schema":
					s.Output.JSONSchema = d.str(v, f+".json_schema", what+": output.json_schema")
				}
			})
		case "tools":
			s.Tools = d.strings(v, f, what+": tools", "[kb.search]")
		case "criteria":
			s.Criteria = d.strings(v, f, what+": criteria", "[cites_keys]")
		case "writer":
			if isNull(v) {
				return
			}
			w := &Writer{}
			d.mapping(v, f, what+": writer", writerFields, func(key string, v *yaml.Node) {
				switch key {
				case "system":
					w.System = d.str(v, f+".system", what+": writer.system")
				case "target":
					w.Target = d.str(v, f+".target", what+": writer.target")
				}
			})
			s.Writer = w
		default:
			d.fanoutField(&s, path, what, key, v)
		}
	})
	if s.Kind == "" && !d.p.bad[path+".kind"] {
		s.Kind = KindAgent
	}
	return s
}

// mapping walks a mapping node: it records positions, reports unknown and repeated keys,
// and calls fn for each known key. A null node is an empty mapping.
func (d *decoder) mapping(n *yaml.Node, path, what string, fields []string, fn func(key string, v *yaml.Node)) {
	n = resolve(n)
	if path != "" {
		d.p.pos[path] = pos(n)
	}
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.typeProblem(n, path, fmt.Sprintf("%s must be a mapping of %s, not %s", what, strings.Join(fields, ", "), describe(n)))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		key := k.Value
		if k.Kind != yaml.ScalarNode {
			d.problem(pos(k), "unknown-field", fmt.Sprintf("%s has a key that is not a plain name; its fields are %s", what, strings.Join(fields, ", ")))
			continue
		}
		if !slices.Contains(fields, key) {
			msg := fmt.Sprintf("unknown field %q in %s", key, what)
			if key == "<<" {
				msg += " (YAML merge keys are not supported: write the fields out)"
			} else if s := suggest(key, fields); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.problem(pos(k), "unknown-field", msg+"; its fields are "+strings.Join(fields, ", "))
			continue
		}
		if line, dup := seen[key]; dup {
			d.problem(pos(k), "duplicate-field", fmt.Sprintf("field %q appears twice in %s (first on line %d): YAML keeps only one of them", key, what, line))
			continue
		}
		seen[key] = k.Line
		f := key
		if path != "" {
			f = path + "." + key
		}
		d.p.pos[f] = pos(v)
		if isNull(v) && v.Line == 0 {
			d.p.pos[f] = pos(k)
		}
		fn(key, v)
	}
}

// sequence walks a list; a null node is an empty list.
func (d *decoder) sequence(n *yaml.Node, path, what string, fn func(i int, item *yaml.Node)) {
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.typeProblem(n, path, fmt.Sprintf("%s must be a list (one '- ' entry per item), not %s", what, describe(n)))
		return
	}
	for i, item := range n.Content {
		item = resolve(item)
		d.p.pos[fmt.Sprintf("%s[%d]", path, i)] = pos(item)
		fn(i, item)
	}
}

// str reads a single value. A null is the empty string.
func (d *decoder) str(n *yaml.Node, path, what string) string {
	n = resolve(n)
	if isNull(n) {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		d.typeProblem(n, path, fmt.Sprintf("%s must be a single value, not %s", what, describe(n)))
		return ""
	}
	return strings.TrimSpace(n.Value)
}

// int reads a whole number. A null is 0.
func (d *decoder) int(n *yaml.Node, path, what string) int {
	n = resolve(n)
	if isNull(n) {
		return 0
	}
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		d.typeProblem(n, path, fmt.Sprintf("%s must be a whole number, not %s", what, describe(n)))
		return 0
	}
	return v
}

// strings reads a list of single values. A null is an empty list.
func (d *decoder) strings(n *yaml.Node, path, what, example string) []string {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.typeProblem(n, path, fmt.Sprintf("%s must be a list such as %s, not %s", what, example, describe(n)))
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, item := range n.Content {
		item = resolve(item)
		f := fmt.Sprintf("%s[%d]", path, i)
		d.p.pos[f] = pos(item)
		if item.Kind != yaml.ScalarNode || isNull(item) {
			d.typeProblem(item, f, fmt.Sprintf("item %d of %s must be a name, not %s", i+1, what, describe(item)))
			continue
		}
		out = append(out, strings.TrimSpace(item.Value))
	}
	return out
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func pos(n *yaml.Node) position {
	if n == nil {
		return position{}
	}
	return position{n.Line, n.Column}
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	n = resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return resolve(n.Content[i+1])
		}
	}
	return nil
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "this"
}

// suggest returns the field closest to key when it is a likely typo.
func suggest(key string, fields []string) string {
	best, bestD := "", 3
	for _, f := range fields {
		if dist := editDistance(strings.ToLower(key), f); dist < bestD {
			best, bestD = f, dist
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].File != ps[j].File {
			return ps[i].File < ps[j].File
		}
		if ps[i].Line != ps[j].Line {
			return ps[i].Line < ps[j].Line
		}
		return ps[i].Col < ps[j].Col
	})
}
