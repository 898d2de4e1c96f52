package hop_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/interceptor/hop"
	"github.com/handoffhq/handoff/internal/testkit"
)

// stream is a grpc.ServerStream whose client sends in; the rest of its methods are unused.
type stream struct {
	grpc.ServerStream
	in    []proto.Message
	recvs int
}

func (s *stream) Context() context.Context { return context.Background() }

func (s *stream) RecvMsg(m any) error {
	s.recvs++
	if len(s.in) == 0 {
		return io.EOF
	}
	proto.Merge(m.(proto.Message), s.in[0])
	s.in = s.in[1:]
	return nil
}

func wantInternal(t *testing.T, err error, msg string) {
	t.Helper()
	if status.Code(err) != codes.Internal || status.Convert(err).Message() != msg {
		t.Errorf("err = %v; want Internal %q", err, msg)
	}
}

func TestReplayStreamServerStreaming(t *testing.T) {
	ss := &stream{in: []proto.Message{&handoffv1.DeliverRequest{Package: pkg()}}}
	first := &handoffv1.DeliverRequest{Package: pkg()}
	rs := hop.NewReplayStream(ss, first, "validate")
	if rs.Context() != ss.Context() {
		t.Error("Context is not the stream's")
	}
	var got handoffv1.DeliverRequest
	if err := rs.RecvMsg(&got); err != nil || !proto.Equal(&got, first) {
		t.Fatalf("first RecvMsg: %v, %v; want the request", &got, err)
	}
	if got.GetPackage() == first.GetPackage() {
		t.Error("the handler's message shares the interceptor's package; want a merged copy")
	}
	for range 2 {
		if err := rs.RecvMsg(&handoffv1.DeliverRequest{}); err != io.EOF {
			t.Errorf("later RecvMsg = %v; want io.EOF", err)
		}
	}
	if ss.recvs != 0 {
		t.Errorf("the real stream was read %d times; want 0", ss.recvs)
	}
}

func TestReplayStreamRest(t *testing.T) {
	next := &handoffv1.DeliverRequest{Package: &handoffv1.HandoffPackage{JobId: "job-2"}}
	ss := &stream{in: []proto.Message{next}}
	rs := hop.NewReplayStream(ss, &handoffv1.DeliverRequest{}, "budget")
	rs.Rest = ss
	if err := rs.RecvMsg(&handoffv1.DeliverRequest{}); err != nil {
		t.Fatal(err)
	}
	var got handoffv1.DeliverRequest
	if err := rs.RecvMsg(&got); err != nil || !proto.Equal(&got, next) {
		t.Errorf("second RecvMsg: %v, %v; want the stream's next message", &got, err)
	}
	if err := rs.RecvMsg(&got); err != io.EOF || ss.recvs != 2 {
		t.Errorf("third RecvMsg = %v after %d reads; want the stream's io.EOF", err, ss.recvs)
	}
}

func TestReplayStreamRefused(t *testing.T) {
	first := &handoffv1.DeliverRequest{Package: pkg()}

	// Default: the errors name the interceptor, and the first RecvMsg uses First up.
	rs := hop.NewReplayStream(&stream{}, first, "budget")
	wantInternal(t, rs.RecvMsg(&handoffv1.CheckRequest{}),
		"budget: handler receives a handoff.v1.CheckRequest, the interceptor read a handoff.v1.DeliverRequest (WithStreamRequest is misconfigured)")
	if err := rs.RecvMsg(&handoffv1.DeliverRequest{}); err != io.EOF {
		t.Errorf("RecvMsg after a refusal = %v; want io.EOF", err)
	}
	rs = hop.NewReplayStream(&stream{}, first, "validate")
	wantInternal(t, rs.RecvMsg(new(int)), "validate: handler receives into *int, not a protobuf message")

	// Refuse and KeepOnRefuse: the custom error, and First is still handed over next time.
	rs = &hop.ReplayStream{ServerStream: &stream{}, First: first, KeepOnRefuse: true,
		Refuse: func(m any) error { return errors.New("refused") }}
	for _, m := range []any{&handoffv1.CheckRequest{}, nil, "x"} {
		if err := rs.RecvMsg(m); err == nil || err.Error() != "refused" {
			t.Errorf("RecvMsg(%T) = %v; want the Refuse error", m, err)
		}
	}
	var got handoffv1.DeliverRequest
	if err := rs.RecvMsg(&got); err != nil || !proto.Equal(&got, first) {
		t.Errorf("RecvMsg after refusals: %v, %v; want the request", &got, err)
	}
	if err := rs.RecvMsg(&got); err != io.EOF {
		t.Errorf("RecvMsg after the request = %v; want io.EOF", err)
	}
	testkit.Equal(t, first, &handoffv1.DeliverRequest{Package: pkg()}, "First (unmodified)")
}

// TestReceiveTakesTheHeldRequest: an interceptor behind a ReplayStream gets the very
// request the one before it received (no copy, nothing read from the client), once; the
// stream then behaves as after its first RecvMsg. A stream holding nothing, or a request
// of another type, is read with RecvMsg.
func TestReceiveTakesTheHeldRequest(t *testing.T) {
	held := &handoffv1.DeliverRequest{Agent: "draft"}
	client := &stream{in: []proto.Message{&handoffv1.DeliverRequest{Agent: "from the client"}}}
	rs := hop.NewReplayStream(client, held, "test")

	got, err := hop.Receive(rs, &handoffv1.DeliverRequest{})
	if err != nil || got != proto.Message(held) {
		t.Fatalf("Receive = %v, %v; want the held request itself", got, err)
	}
	if client.recvs != 0 {
		t.Fatalf("%d reads from the client; want 0", client.recvs)
	}
	if err := rs.RecvMsg(&handoffv1.DeliverRequest{}); err != io.EOF {
		t.Fatalf("RecvMsg after the hand-over = %v; want io.EOF (server-streaming, handed once)", err)
	}

	// Another type: not taken, read from the stream (here: refused by the ReplayStream).
	rs2 := hop.NewReplayStream(client, held, "test")
	if _, err := hop.Receive(rs2, &handoffv1.CheckRequest{}); status.Code(err) != codes.Internal {
		t.Fatalf("Receive into another type = %v; want the ReplayStream's Internal refusal", err)
	}

	// Not a holder: RecvMsg into the message given.
	into := &handoffv1.DeliverRequest{}
	got, err = hop.Receive(client, into)
	if err != nil || got != proto.Message(into) || into.GetAgent() != "from the client" || client.recvs != 1 {
		t.Fatalf("Receive from the client = %v, %v (%d reads); want its message in into", got, err, client.recvs)
	}
}
