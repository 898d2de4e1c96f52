package hop

import (
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ReplayStream is the stream a handler gets when its interceptor has already received the
// request itself: the first RecvMsg hands First over (proto.Merge into the handler's
// message, which must be of First's type), later ones receive from Rest, or return io.EOF
// when Rest is nil (server-streaming). Everything else is the embedded stream's. Like any
// grpc.ServerStream, its RecvMsg must not be called from several goroutines at once.
type ReplayStream struct {
	grpc.ServerStream
	First proto.Message
	Rest  grpc.ServerStream // nil: io.EOF once First is handed over

	// Who names the interceptor in the codes.Internal errors of a RecvMsg into a message
	// that cannot take First: "<Who>: handler receives into T, not a protobuf message",
	// "<Who>: handler receives a X, the interceptor read a Y (WithStreamRequest is
	// misconfigured)".
	Who string
	// Refuse, when set, makes that error instead.
	Refuse func(m any) error
	// KeepOnRefuse: a refused RecvMsg leaves First for the next one. Otherwise the first
	// RecvMsg uses First up whatever its outcome.
	KeepOnRefuse bool

	handed bool
}

// NewReplayStream returns the ReplayStream of ss that hands the handler first, with its
// errors named after the interceptor who (Rest unset: io.EOF after first).
func NewReplayStream(ss grpc.ServerStream, first proto.Message, who string) *ReplayStream {
	return &ReplayStream{ServerStream: ss, First: first, Who: who}
}

// RecvMsg hands First over the first time, then receives from Rest (io.EOF without one).
func (s *ReplayStream) RecvMsg(m any) error {
	if s.handed {
		if s.Rest == nil {
			return io.EOF
		}
		return s.Rest.RecvMsg(m)
	}
	if !s.KeepOnRefuse {
		s.handed = true
	}
	dst, ok := m.(proto.Message)
	if !ok || dst.ProtoReflect().Descriptor().FullName() != s.First.ProtoReflect().Descriptor().FullName() {
		return s.refuse(m)
	}
	s.handed = true
	proto.Merge(dst, s.First)
	return nil
}

func (s *ReplayStream) refuse(m any) error {
	if s.Refuse != nil {
		return s.Refuse(m)
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "%s: handler receives into %T, not a protobuf message", s.Who, m)
	}
	return status.Errorf(codes.Internal, "%s: handler receives a %s, the interceptor read a %s (WithStreamRequest is misconfigured)",
		s.Who, pm.ProtoReflect().Descriptor().FullName(), s.First.ProtoReflect().Descriptor().FullName())
}
