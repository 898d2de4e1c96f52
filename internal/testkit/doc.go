// Package testkit is what the tests of every package share, so that none keeps its own
// copy:
//
//   - Serve and ServeTCP run a gRPC server for one test (bufconn in memory, or 127.0.0.1)
//     and stop it when the test ends; give them a server assembled by internal/server
//     (server.New) to test a service as the binaries serve it.
//   - Eventually waits for a condition, with a bound and a message.
//   - Package builds a valid handoff.v1 package to change in a test.
//   - Diff and Equal compare messages with protocmp and show the difference.
//   - LLM (NewLLM, ServeLLM) is a scripted OpenAI-compatible chat-completions server.
//   - MCPTools is a real MCP tool server (a read and a write tool), in process
//     (ServeMCPHTTP) or as a stdio subprocess (BuildMCPServer).
//
// It imports no package of this module but the generated code (and, for mcpserver, itself),
// so any package's tests (internal ones too) can use it.
package testkit
