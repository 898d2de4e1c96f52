package coordinator

import (
	"google.golang.org/grpc"

	"github.com/handoffhq/handoff/internal/server"
)

// Service is the coordinator as internal/server assembles it: the CoordinatorService and its
// enforcement (Interceptors) as step 6 of the chain. The binary and `handoff up` also give
// the server Close as its drain (server.WithDrain), so a stop lets the drivers finish.
func (s *Server) Service() server.Service {
	unary, stream := s.Interceptors()
	return server.Service{Name: "coordinator", Register: func(g *grpc.Server) { Register(g, s) }, Unary: unary, Stream: stream}
}
