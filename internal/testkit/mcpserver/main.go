// Command mcpserver serves testkit.MCPTools (kb_search: read; crm_patch: write) over stdio,
// for tests that need a real MCP server in its own process.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/handoffhq/handoff/internal/testkit"
)

func main() {
	var tools testkit.MCPTools
	flag.StringVar(&tools.CrashOn, "crash-on", "", "exit mid-call when this tool is called")
	flag.DurationVar(&tools.Delay, "delay", 0, "wait this long in every call")
	flag.Parse()
	if err := tools.Server().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "mcpserver:", err)
		os.Exit(1)
	}
}
