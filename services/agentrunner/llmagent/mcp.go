package llmagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/handoffhq/handoff/internal/pipeline"
	"github.com/handoffhq/handoff/services/agentrunner"
)

// MCP holds the sessions to a pipeline's MCP tool servers: a command over stdio or a
// streamable-HTTP URL, connected once and shared by the stages' tool calls.
type MCP struct {
	sessions map[string]*mcp.ClientSession
	tools    map[string]map[string]*mcp.Tool // server -> tool name -> its declaration
}

// ConnectMCP connects to every server and lists its tools. A server that cannot be
// started or reached is an error naming it. httpClient may be nil.
func ConnectMCP(ctx context.Context, servers []pipeline.MCPServer, httpClient *http.Client) (*MCP, error) {
	m := &MCP{sessions: map[string]*mcp.ClientSession{}, tools: map[string]map[string]*mcp.Tool{}}
	client := mcp.NewClient(&mcp.Implementation{Name: "handoff-agentrunner", Version: "v1"}, nil)
	for _, s := range servers {
		var t mcp.Transport
		switch {
		case len(s.Command) > 0:
			t = &mcp.CommandTransport{Command: exec.Command(s.Command[0], s.Command[1:]...), TerminateDuration: 2 * time.Second}
		case s.URL != "":
			t = &mcp.StreamableClientTransport{Endpoint: s.URL, HTTPClient: httpClient, DisableStandaloneSSE: true, MaxRetries: -1}
		default:
			m.Close()
			return nil, fmt.Errorf("llmagent: MCP server %q has neither a command nor a url", s.Name)
		}
		cs, err := client.Connect(ctx, t, nil)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("llmagent: MCP server %q: connecting: %w", s.Name, err)
		}
		m.sessions[s.Name] = cs
		m.tools[s.Name] = map[string]*mcp.Tool{}
		for tool, err := range cs.Tools(ctx, nil) {
			if err != nil {
				m.Close()
				return nil, fmt.Errorf("llmagent: MCP server %q: listing tools: %w", s.Name, err)
			}
			m.tools[s.Name][tool.Name] = tool
		}
	}
	return m, nil
}

// Close ends every session (and stops the stdio servers).
func (m *MCP) Close() error {
	var errs []error
	for _, cs := range m.sessions {
		errs = append(errs, cs.Close())
	}
	return errors.Join(errs...)
}

// Tool returns catalogue tool ct, served by its MCP server.
func (m *MCP) Tool(ct pipeline.Tool) (Tool, error) {
	if ct.MCP == nil {
		return Tool{}, fmt.Errorf("llmagent: tool %s has no mcp: server in the catalogue", ct.Name)
	}
	cs, ok := m.sessions[ct.MCP.Server]
	if !ok {
		return Tool{}, fmt.Errorf("llmagent: tool %s: MCP server %q is not connected", ct.Name, ct.MCP.Server)
	}
	decl, ok := m.tools[ct.MCP.Server][ct.MCP.Tool]
	if !ok {
		return Tool{}, fmt.Errorf("llmagent: tool %s: MCP server %q has no tool %q", ct.Name, ct.MCP.Server, ct.MCP.Tool)
	}
	var params map[string]any
	if decl.InputSchema != nil {
		b, err := json.Marshal(decl.InputSchema)
		if err == nil {
			err = json.Unmarshal(b, &params)
		}
		if err != nil {
			return Tool{}, fmt.Errorf("llmagent: tool %s: its input schema: %w", ct.Name, err)
		}
	}
	name, server := ct.MCP.Tool, ct.MCP.Server
	return Tool{
		Name: ct.Name, Description: decl.Description, Params: params, Access: ct.Access, System: ct.System,
		Call: func(ctx context.Context, args json.RawMessage) (string, error) {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
			if err != nil {
				var rpcErr *jsonrpc.Error
				switch {
				case ctx.Err() != nil:
					return "", &ToolError{CodeTimeout, fmt.Errorf("MCP server %s did not answer: %w", server, ctx.Err())}
				case errors.As(err, &rpcErr):
					return "", &ToolError{CodeToolError, err} // the server answered: an error
				default:
					return "", &ToolError{CodeUnavailable, fmt.Errorf("MCP server %s: %w", server, err)}
				}
			}
			out := resultText(res)
			if res.IsError {
				return "", &ToolError{CodeToolError, errors.New(clip(out, 500))}
			}
			return out, nil
		},
	}, nil
}

// resultText is the text a tool result shows the model: its text parts, or its
// structured content as JSON.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		}
	}
	return strings.Join(parts, "\n")
}

// RoleFor is the role of pipeline p's stage for a model: base (instructions, output media
// type, a judge's failure codes) with what the pipeline declares put on top. Its card is
// the stage's agent name and exactly the stage's catalogue tools, each served by its MCP
// server in m; it may hold write tools only as the writer of their system, and a judge
// none (New refuses the role otherwise).
func RoleFor(p *pipeline.Pipeline, stage string, base Role, m *MCP) (Role, error) {
	st, _, ok := p.Stage(stage)
	if !ok {
		return Role{}, fmt.Errorf("llmagent: pipeline %s has no stage %q", p.Name, stage)
	}
	r := base
	r.Card = agentrunner.RoleCard{Name: st.AgentName()}
	r.Judge = st.Kind == pipeline.KindJudge
	r.Tools = nil
	for _, name := range st.Tools {
		ct, ok := p.Tool(name)
		if !ok {
			return Role{}, fmt.Errorf("llmagent: stage %s holds tool %s, which the catalogue does not declare", stage, name)
		}
		if m == nil {
			return Role{}, fmt.Errorf("llmagent: stage %s holds tool %s and no MCP servers are connected", stage, name)
		}
		t, err := m.Tool(ct)
		if err != nil {
			return Role{}, err
		}
		r.Tools = append(r.Tools, t)
		if ct.Access == pipeline.AccessWrite && st.Kind == pipeline.KindWriteback && st.Writer != nil && st.Writer.System == ct.System {
			r.Writer = true
		}
	}
	if st.Instructions != "" {
		r.Instructions = st.Instructions
	}
	if st.MaxToolRounds > 0 {
		r.MaxToolRounds = st.MaxToolRounds
	}
	r.Output.Type, r.Output.SchemaVersion = st.Output.Type, st.Output.SchemaVersion
	if js := st.Output.JSONSchema; js != "" {
		if !filepath.IsAbs(js) && p.Source != "" {
			js = filepath.Join(filepath.Dir(p.Source), js)
		}
		s, err := LoadSchema(js)
		if err != nil {
			return Role{}, fmt.Errorf("stage %s: %w", stage, err)
		}
		r.OutputSchema = s
	}
	return r, nil
}

// PricesOf is pipeline p's model price table as Config.Prices.
func PricesOf(p *pipeline.Pipeline) map[string]Price {
	out := map[string]Price{}
	for _, pr := range p.Prices {
		out[pr.Model] = Price{int64(pr.PromptMicrosPer1K), int64(pr.CompletionMicrosPer1K)}
	}
	return out
}
