package store_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/internal/store"
	"github.com/handoffhq/handoff/internal/store/storetest"
)

// TestEventEncodingKeepsEverything: an event stored once encoded (bbolt puts its seq in
// front of that encoding) reads back as the caller's event with the store's seq: fields it
// carried, unknown fields from a newer release, and a seq it came with (replaced). Many
// concurrent appends, which bbolt batches and may retry, give each event its own seq.
func TestEventEncodingKeepsEverything(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) store.Store{
		"bolt": func(t *testing.T) store.Store {
			s, err := store.Open(filepath.Join(t.TempDir(), "handoff.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"redis": func(t *testing.T) store.Store { return storetest.OpenRedis(t) },
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ctx := context.Background()
			if _, _, err := s.CreateRun(ctx, &handoffv1.Job{RunId: "enc", JobId: "enc"}); err != nil {
				t.Fatal(err)
			}
			var unknown []byte
			unknown = protowire.AppendTag(unknown, 999, protowire.BytesType)
			unknown = protowire.AppendBytes(unknown, []byte("from a newer release"))
			const n = 40
			given := make([]*handoffv1.JobEvent, n)
			for i := range given {
				ev := &handoffv1.JobEvent{Kind: handoffv1.EventKind_EVENT_KIND_ACK, Stage: "s", Hop: uint32(i + 1),
					Wallet: &handoffv1.Budget{HopsRemaining: uint32(i)}, Seq: uint64(1000 + i%2*i)}
				ev.ProtoReflect().SetUnknown(unknown)
				given[i] = ev
			}
			want := make([]*handoffv1.JobEvent, n)
			for i, ev := range given {
				want[i] = proto.Clone(ev).(*handoffv1.JobEvent)
			}
			var wg sync.WaitGroup
			seqs := make([]uint64, n)
			for i := range given {
				wg.Go(func() {
					seq, err := s.AppendEvent(ctx, "enc", given[i])
					if err != nil {
						t.Error(err)
					}
					seqs[i] = seq
				})
			}
			wg.Wait()
			evs, err := s.Events(ctx, "enc", 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != n {
				t.Fatalf("%d events stored; want %d", len(evs), n)
			}
			for i := range given {
				if given[i].GetSeq() != seqs[i] {
					t.Fatalf("event %d: the caller's seq is %d after the append; want the returned %d", i, given[i].GetSeq(), seqs[i])
				}
				w := want[i]
				w.Seq = seqs[i]
				got := evs[seqs[i]-1]
				if d := cmp.Diff(w, got, protocmp.Transform()); d != "" {
					t.Fatalf("event %d as stored differs from the one appended (-want +got):\n%s", i, d)
				}
				if string(got.ProtoReflect().GetUnknown()) != string(unknown) {
					t.Fatalf("event %d lost its unknown fields", i)
				}
			}
		})
	}
}
