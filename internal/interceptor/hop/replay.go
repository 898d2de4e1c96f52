package hop

import (
	"errors"
	"io"
	"reflect"

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

// Holder is a stream that holds a request its interceptor received and has not handed on
// yet (ReplayStream, and the streams that embed it).
type Holder interface {
	// TakeRequest hands the held request over by reference, once, when its Go type is
	// want; the stream then behaves as after its first RecvMsg.
	TakeRequest(want reflect.Type) (proto.Message, bool)
}

// TakeRequest implements Holder.
func (s *ReplayStream) TakeRequest(want reflect.Type) (proto.Message, bool) {
	if s.handed || reflect.TypeOf(s.First) != want {
		return nil, false
	}
	s.handed = true
	return s.First, true
}

// Receive receives the first request of ss for an interceptor that reads it before its
// handler does. When an interceptor earlier in the chain already received it (ss is a
// Holder of a request of into's type), that very message is returned, not a copy: every
// interceptor of a hop would otherwise copy the ~2 KB package once more (a proto.Merge
// each). Otherwise into is filled by ss.RecvMsg and returned. The message is shared along
// the chain from then on, so no interceptor may change it after handing it on. A handler
// that receives with RecvMsg gets its own copy from the last ReplayStream; one that
// receives with Receive (the agent runner's Deliver) shares the message too.
func Receive(ss grpc.ServerStream, into proto.Message) (proto.Message, error) {
	if h, ok := ss.(Holder); ok {
		if m, ok := h.TakeRequest(reflect.TypeOf(into)); ok {
			return m, nil
		}
	}
	if err := ss.RecvMsg(into); err != nil {
		return nil, err
	}
	return into, nil
}

// ReceiveRequest is Receive for the request of a server-streaming method: a stream that
// ends before its request arrives is InvalidArgument naming method.
func ReceiveRequest(ss grpc.ServerStream, into proto.Message, method string) (proto.Message, error) {
	m, err := Receive(ss, into)
	if errors.Is(err, io.EOF) {
		return nil, status.Errorf(codes.InvalidArgument, "%s: the request message is missing", method)
	}
	return m, err
}
