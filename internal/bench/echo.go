package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The bare service of figures A and echo: hand-registered on a plain grpc.Server (no
// interceptors, no stats handler), messages google.protobuf.BytesValue.
const (
	echoServiceName = "handoff.bench.Bare"
	echoMethod      = "/" + echoServiceName + "/Echo"
	hopMethod       = "/" + echoServiceName + "/Hop"
	// claimTTL is the PX of the bare hop's SET NX, as an idempotency claim has one.
	claimTTL = 2 * time.Minute
)

type bareServer interface{ bare() }

type bare struct {
	rdb    *redis.Client // nil: Hop is unavailable
	prefix string
}

func (*bare) bare() {}

var bareDesc = grpc.ServiceDesc{
	ServiceName: echoServiceName,
	HandlerType: (*bareServer)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return in, nil
		}},
		{MethodName: "Hop", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			s := srv.(*bare)
			if s.rdb == nil {
				return nil, status.Error(codes.Unavailable, "no redis")
			}
			if len(in.Value) < 8 {
				return nil, status.Error(codes.InvalidArgument, "payload too short")
			}
			key := s.prefix + fmt.Sprint(binary.BigEndian.Uint64(in.Value))
			ok, err := s.rdb.SetNX(ctx, key, "P", claimTTL).Result()
			if err != nil {
				return nil, status.Errorf(codes.Unavailable, "redis: %v", err)
			}
			if !ok {
				return nil, status.Errorf(codes.AlreadyExists, "key %s taken", key)
			}
			return &wrapperspb.BytesValue{Value: in.Value[:8]}, nil
		}},
	},
	Metadata: "internal/bench/echo.go",
}

// bareRig serves figures A (Hop) and echo (Echo) on one plain gRPC server over 127.0.0.1.
type bareRig struct {
	g         *grpc.Server
	cc        *grpc.ClientConn
	srv       *bare
	redisAddr string
	seq       atomic.Uint64
	bufs      [][]byte // one payload buffer per worker
}

// newBareRig starts the server. redisAddr "" leaves Hop unavailable (echo only).
func newBareRig(ctx context.Context, redisAddr string, workers int) (*bareRig, error) {
	r := &bareRig{srv: &bare{prefix: newPrefix("bare")}, redisAddr: redisAddr}
	if redisAddr != "" {
		rdb, err := newRedis(ctx, redisAddr)
		if err != nil {
			return nil, err
		}
		r.srv.rdb = rdb
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.close()
		return nil, err
	}
	r.g = grpc.NewServer()
	r.g.RegisterService(&bareDesc, r.srv)
	go r.g.Serve(lis)
	if r.cc, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		r.close()
		return nil, err
	}
	r.bufs = make([][]byte, max(workers, 1))
	for i := range r.bufs {
		r.bufs[i] = make([]byte, EchoBytes)
		for j := 8; j < EchoBytes; j++ {
			r.bufs[i][j] = byte('a' + j%26)
		}
	}
	return r, nil
}

func (r *bareRig) payload(worker int) *wrapperspb.BytesValue {
	b := r.bufs[worker%len(r.bufs)]
	binary.BigEndian.PutUint64(b, r.seq.Add(1))
	return &wrapperspb.BytesValue{Value: b}
}

// echo is one Echo call: 1 KiB there and back.
func (r *bareRig) echo(ctx context.Context, worker int) error {
	out := new(wrapperspb.BytesValue)
	if err := r.cc.Invoke(ctx, echoMethod, r.payload(worker), out); err != nil {
		return err
	}
	if len(out.Value) != EchoBytes {
		return fmt.Errorf("echo returned %d bytes, want %d", len(out.Value), EchoBytes)
	}
	return nil
}

// hop is one bare hop: 1 KiB there, one SET NX on a fresh key, 8 bytes back.
func (r *bareRig) hop(ctx context.Context, worker int) error {
	return r.cc.Invoke(ctx, hopMethod, r.payload(worker), new(wrapperspb.BytesValue))
}

func (r *bareRig) close() {
	if r.cc != nil {
		r.cc.Close()
	}
	if r.g != nil {
		r.g.Stop()
	}
	if r.srv.rdb != nil {
		r.srv.rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		deletePrefix(ctx, r.redisAddr, r.srv.prefix)
		cancel()
	}
}
