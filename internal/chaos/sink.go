package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// sink is the external system the writeback's webhook target writes to. It records every
// delivery it receives and honours Idempotency-Key as a real downstream does: the first
// delivery of a key is applied, and a later one with the same key is answered with the first
// one's id and applied no more (a re-sent delivery the key absorbed). A key re-sent with a
// different body is a conflict: the platform changed a write it had already made.
type sink struct {
	mu         sync.Mutex
	deliveries []delivery
	applied    map[string]*applied // by Idempotency-Key
	perJob     map[string]int      // writes applied per job_id (a job should have at most one)
	resent     int                 // deliveries absorbed by their key
	conflicts  int                 // re-sent with a different body
	noKey      int                 // deliveries without an Idempotency-Key (each applied)
	seq        int

	// onApply, when set, runs after a delivery was applied and before it is answered: the
	// harness kills the writeback there, so the write happened but its answer is lost.
	onApply func()

	srv *http.Server
	url string
}

// delivery is one POST as received.
type delivery struct {
	Key   string          `json:"key"`
	JobID string          `json:"job_id"`
	Body  json.RawMessage `json:"body"`
	At    time.Time       `json:"at"`
}

type applied struct {
	id   string
	body []byte
}

func newSink() *sink {
	return &sink{applied: map[string]*applied{}, perJob: map[string]int{}}
}

func (s *sink) start() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.url = "http://" + l.Addr().String() + "/writes"
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go s.srv.Serve(l)
	return nil
}

func (s *sink) close() { s.srv.Close() }

// setOnApply sets the hook run after each applied delivery (see onApply).
func (s *sink) setOnApply(f func()) {
	s.mu.Lock()
	s.onApply = f
	s.mu.Unlock()
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg struct {
		JobID string `json:"job_id"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		http.Error(w, "body is not JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.deliveries = append(s.deliveries, delivery{Key: key, JobID: msg.JobID, Body: json.RawMessage(bytes.Clone(body)), At: time.Now()})
	if a, ok := s.applied[key]; ok && key != "" {
		s.resent++
		if !bytes.Equal(a.body, body) {
			s.conflicts++
		}
		id := a.id
		s.mu.Unlock()
		answer(w, id)
		return
	}
	s.seq++
	id := fmt.Sprintf("sink-%06d", s.seq)
	if key == "" {
		s.noKey++
	} else {
		s.applied[key] = &applied{id: id, body: bytes.Clone(body)}
	}
	s.perJob[msg.JobID]++
	hook := s.onApply
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	answer(w, id)
}

func answer(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"id": id})
}

// SinkReport is what the sink saw.
type SinkReport struct {
	// Deliveries is every POST received, re-sends included.
	Deliveries int `json:"deliveries"`
	// KeysApplied is the number of distinct Idempotency-Keys applied.
	KeysApplied int `json:"distinct_keys_applied"`
	// DoubleWrites counts writes applied beyond the first for one job: under a second key,
	// or without a key. Must be 0.
	DoubleWrites int `json:"double_writes"`
	// ResentAbsorbed counts deliveries of an already applied key, answered with the first
	// id and not applied again: the writes the downstream key made harmless.
	ResentAbsorbed int `json:"resent_absorbed_by_key"`
	// Conflicts counts re-sent keys whose body differed from the applied one. Must be 0.
	Conflicts int `json:"conflicting_resends"`
	// NoKey counts deliveries that carried no Idempotency-Key.
	NoKey int `json:"deliveries_without_key"`
}

func (s *sink) report() SinkReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := SinkReport{Deliveries: len(s.deliveries), KeysApplied: len(s.applied), ResentAbsorbed: s.resent, Conflicts: s.conflicts, NoKey: s.noKey}
	for _, n := range s.perJob {
		if n > 1 {
			r.DoubleWrites += n - 1
		}
	}
	return r
}

// writesFor is how many writes were applied for job.
func (s *sink) writesFor(jobID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perJob[jobID]
}

// dump writes every delivery as JSON lines.
func (s *sink) dump(w io.Writer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	enc := json.NewEncoder(w)
	for _, d := range s.deliveries {
		if err := enc.Encode(d); err != nil {
			return err
		}
	}
	return nil
}
