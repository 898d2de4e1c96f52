package rpc

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Invalid UTF-8 in a request's string field is the caller's mistake, but grpc-go turns any
// codec error into codes.Internal ("grpc: failed to unmarshal the received message",
// rpc_util.go recv) and writes that status at once (serverStream.RecvMsg), before a
// handler or interceptor could change it. So the server's codec does not fail on it: it
// leaves the request empty with a mark naming the field in its unknown fields, and the
// utf8 interceptors (in the chain right after identity) answer a marked request with
// InvalidArgument. Other decode errors stay as grpc-go reports them.

// markNum is the field number of the mark: the largest valid one, used by no message here.
const markNum = protowire.MaxValidNumber

// utf8Codec is grpc-go's proto codec with the decode of invalid UTF-8 turned into a mark.
type utf8Codec struct{ base encoding.CodecV2 }

func newUTF8Codec() utf8Codec { return utf8Codec{base: encoding.GetCodecV2(protoenc.Name)} }

func (c utf8Codec) Name() string { return protoenc.Name }

func (c utf8Codec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c utf8Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	r := m.ProtoReflect()
	if err == nil {
		// A caller cannot send the mark itself.
		if u := r.GetUnknown(); len(u) > 0 {
			if kept, found := dropMark(u); found {
				r.SetUnknown(kept)
			}
		}
		return nil
	}
	field, bad := badUTF8(r.Descriptor(), data.Materialize(), "")
	if !bad {
		return err
	}
	proto.Reset(m)
	r.SetUnknown(protowire.AppendString(protowire.AppendTag(nil, markNum, protowire.BytesType), field))
	return nil
}

// marked returns the field a request was marked for, if it was.
func marked(v any) (string, bool) {
	m, ok := v.(proto.Message)
	if !ok {
		return "", false
	}
	for b := m.ProtoReflect().GetUnknown(); len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		if num == markNum && typ == protowire.BytesType {
			s, n := protowire.ConsumeString(b)
			return s, n >= 0
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return "", false
		}
		b = b[n:]
	}
	return "", false
}

// dropMark returns unknown-field bytes without any mark field, and whether there was one.
func dropMark(b []byte) ([]byte, bool) {
	var kept []byte
	found := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return b, found
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return b, found
		}
		if num == markNum {
			found = true
		} else {
			kept = append(kept, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return kept, found
}

// badUTF8 walks the wire bytes b of a message md and returns the path of the first string
// field whose value is not valid UTF-8 ("package.artifacts[0].uri", proto field names,
// the index counting occurrences of a repeated field). Malformed wire data ends the walk
// with false: that error is not this one.
func badUTF8(md protoreflect.MessageDescriptor, b []byte, prefix string) (string, bool) {
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return "", false
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		name := prefix + fd.TextName()
		if fd.IsList() {
			name = fmt.Sprintf("%s[%d]", name, seen[num])
			seen[num]++
		}
		switch {
		case fd.IsMap():
			if p, bad := badUTF8(fd.Message(), v, name+"."); bad {
				return p, true
			}
		case fd.Kind() == protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name, true
			}
		case fd.Kind() == protoreflect.MessageKind:
			if p, bad := badUTF8(fd.Message(), v, name+"."); bad {
				return p, true
			}
		}
	}
	return "", false
}

// utf8Error is the answer to a request marked by the codec.
func utf8Error(field string) error {
	const msg = "invalid UTF-8 in a string field"
	st := status.New(codes.InvalidArgument, fmt.Sprintf("invalid request: %s: %s", field, msg))
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: field, Description: msg, Reason: "STRING_UTF8"},
	}}); err == nil {
		st = d
	}
	return st.Err()
}

// utf8Unary refuses a unary request the codec marked.
func utf8Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if field, ok := marked(req); ok {
		return nil, utf8Error(field)
	}
	return handler(ctx, req)
}

// utf8Stream refuses a streamed message the codec marked: RecvMsg returns InvalidArgument,
// and the call ends with that error whatever the handler makes of it.
func utf8Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	w := &utf8ServerStream{ServerStream: ss}
	err := handler(srv, w)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	return err
}

type utf8ServerStream struct {
	grpc.ServerStream
	mu  sync.Mutex
	err error
}

func (s *utf8ServerStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if field, ok := marked(m); ok {
		err := utf8Error(field)
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
		return err
	}
	return nil
}
