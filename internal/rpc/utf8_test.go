package rpc_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/server"
	"github.com/handoffhq/handoff/internal/testkit"
)

// raw is a client codec that sends []byte as it is, so a test can put bytes on the wire
// that no proto library would marshal.
type raw struct{}

func (raw) Name() string { return "proto" }
func (raw) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (raw) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// seenRunner records the requests that reached its handlers.
type seenRunner struct {
	handoffv1.UnimplementedAgentRunnerServiceServer
	mu   sync.Mutex
	seen []proto.Message
}

func (r *seenRunner) saw(m proto.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, m)
}

func (r *seenRunner) calls() []proto.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Message(nil), r.seen...)
}

func (r *seenRunner) Check(_ context.Context, req *handoffv1.CheckRequest) (*handoffv1.CheckResponse, error) {
	r.saw(req)
	return &handoffv1.CheckResponse{}, nil
}

func (r *seenRunner) Deliver(req *handoffv1.DeliverRequest, s grpc.ServerStreamingServer[handoffv1.DeliverResponse]) error {
	r.saw(req)
	return nil
}

// serveRunner serves r as a service's server is assembled (internal/server, whose chain
// is rpc.NewServer's) and returns a connection to it.
func serveRunner(t *testing.T, r handoffv1.AgentRunnerServiceServer) *grpc.ClientConn {
	t.Helper()
	srv, err := server.New(server.Service{Name: "utf8", Register: func(g *grpc.Server) { handoffv1.RegisterAgentRunnerServiceServer(g, r) }},
		server.WithoutIdentity(), server.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return testkit.Serve(t, srv)
}

// withBadByte marshals m and turns the first byte of the placeholder ZZZZ into 0xff, which
// no UTF-8 sequence starts with (the wire lengths stay right).
func withBadByte(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte("ZZZZ")) != 1 {
		t.Fatal("want exactly one ZZZZ placeholder")
	}
	return bytes.Replace(b, []byte("ZZZZ"), []byte("\xffZZZ"), 1)
}

func call(ctx context.Context, cc *grpc.ClientConn, method string, stream bool, req []byte) error {
	var resp []byte
	if !stream {
		return cc.Invoke(ctx, method, &req, &resp, grpc.ForceCodecV2(raw{}))
	}
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method, grpc.ForceCodecV2(raw{}))
	if err != nil {
		return err
	}
	if err := s.SendMsg(&req); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		if err := s.RecvMsg(&resp); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// TestInvalidUTF8IsInvalidArgument: raw bytes with invalid UTF-8 in a string field, sent
// over real gRPC to a server built by NewServer, answer InvalidArgument naming the field
// (with a google.rpc.BadRequest violation) for a unary and a streaming method, and never
// reach the handler. grpc-go alone answers Internal ("failed to unmarshal").
func TestInvalidUTF8IsInvalidArgument(t *testing.T) {
	r := &seenRunner{}
	cc := serveRunner(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	pkg := func() *handoffv1.HandoffPackage {
		return &handoffv1.HandoffPackage{JobId: "job-1", Goal: "fine", Constraints: []string{"ok", "also ok"},
			Artifacts: []*handoffv1.Artifact{{Uri: "file:///a"}, {Uri: "file:///b"}}}
	}
	cases := []struct {
		name, field string
		mod         func(p *handoffv1.HandoffPackage)
	}{
		{"goal", "package.goal", func(p *handoffv1.HandoffPackage) { p.Goal = "ZZZZ" }},
		{"repeated", "package.constraints[1]", func(p *handoffv1.HandoffPackage) { p.Constraints[1] = "ZZZZ" }},
		{"nested", "package.artifacts[1].uri", func(p *handoffv1.HandoffPackage) { p.Artifacts[1].Uri = "file:///ZZZZ" }},
	}
	for _, m := range []struct {
		method string
		stream bool
		req    func(*handoffv1.HandoffPackage) proto.Message
	}{
		{"/handoff.v1.AgentRunnerService/Check", false, func(p *handoffv1.HandoffPackage) proto.Message { return &handoffv1.CheckRequest{Package: p} }},
		{"/handoff.v1.AgentRunnerService/Deliver", true, func(p *handoffv1.HandoffPackage) proto.Message { return &handoffv1.DeliverRequest{Package: p} }},
	} {
		for _, c := range cases {
			t.Run(m.method+"/"+c.name, func(t *testing.T) {
				p := pkg()
				c.mod(p)
				before := len(r.calls())
				err := call(ctx, cc, m.method, m.stream, withBadByte(t, m.req(p)))
				st := status.Convert(err)
				if st.Code() != codes.InvalidArgument {
					t.Fatalf("%v; want InvalidArgument", err)
				}
				if want := "invalid request: " + c.field + ": invalid UTF-8 in a string field"; st.Message() != want {
					t.Fatalf("message %q, want %q", st.Message(), want)
				}
				var fields []string
				for _, d := range st.Details() {
					if br, ok := d.(*errdetails.BadRequest); ok {
						for _, fv := range br.GetFieldViolations() {
							fields = append(fields, fv.GetField()+"/"+fv.GetReason())
						}
					}
				}
				if len(fields) != 1 || fields[0] != c.field+"/STRING_UTF8" {
					t.Fatalf("BadRequest violations %v, want [%s/STRING_UTF8]", fields, c.field)
				}
				if n := len(r.calls()); n != before {
					t.Fatal("the handler ran")
				}
			})
		}
	}

	// Valid requests still reach the handler, and a client sending the codec's mark
	// field itself is neither refused nor lets the mark through.
	t.Run("valid and spoofed mark", func(t *testing.T) {
		for _, m := range []struct {
			method string
			stream bool
			req    proto.Message
		}{
			{"/handoff.v1.AgentRunnerService/Check", false, &handoffv1.CheckRequest{Package: pkg()}},
			{"/handoff.v1.AgentRunnerService/Deliver", true, &handoffv1.DeliverRequest{Package: pkg()}},
		} {
			b, err := proto.Marshal(m.req)
			if err != nil {
				t.Fatal(err)
			}
			spoof := protowire.AppendString(protowire.AppendTag(append([]byte(nil), b...), protowire.MaxValidNumber, protowire.BytesType), "package.goal")
			for _, body := range [][]byte{b, spoof} {
				before := len(r.calls())
				if err := call(ctx, cc, m.method, m.stream, body); err != nil {
					t.Fatalf("%s: %v", m.method, err)
				}
				got := r.calls()
				if len(got) != before+1 {
					t.Fatalf("%s: handler ran %d times, want once", m.method, len(got)-before)
				}
				last := got[len(got)-1]
				if !proto.Equal(last, m.req) || len(last.ProtoReflect().GetUnknown()) != 0 {
					t.Fatalf("%s: handler got %v (unknown %x), want %v", m.method, last, last.ProtoReflect().GetUnknown(), m.req)
				}
			}
		}
	})
}
