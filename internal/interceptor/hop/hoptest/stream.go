// Package hoptest has test doubles for the interceptor packages' tests.
package hoptest

import (
	"context"
	"io"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Stream is a grpc.ServerStream for calling a stream interceptor directly: its client sends
// In, one message per RecvMsg (merged into the receiver's message), then io.EOF, or Err for
// every RecvMsg when Err is set. SendMsg records a copy of each message in Sent. Context is
// Ctx, or context.Background() when nil.
type Stream struct {
	Ctx   context.Context
	In    []proto.Message
	Err   error
	Recvs int // RecvMsg calls
	Sent  []proto.Message
}

func (s *Stream) SetHeader(metadata.MD) error  { return nil }
func (s *Stream) SendHeader(metadata.MD) error { return nil }
func (s *Stream) SetTrailer(metadata.MD)       {}

func (s *Stream) Context() context.Context {
	if s.Ctx == nil {
		return context.Background()
	}
	return s.Ctx
}

func (s *Stream) SendMsg(m any) error {
	s.Sent = append(s.Sent, proto.Clone(m.(proto.Message)))
	return nil
}

func (s *Stream) RecvMsg(m any) error {
	s.Recvs++
	if s.Err != nil {
		return s.Err
	}
	if len(s.In) == 0 {
		return io.EOF
	}
	proto.Merge(m.(proto.Message), s.In[0])
	s.In = s.In[1:]
	return nil
}
