package chaos

import (
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, url, key, body string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST: %s", resp.Status)
	}
	var b strings.Builder
	buf := make([]byte, 256)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	return b.String()
}

// TestSinkHonoursKeys: a key is applied once, a re-send is absorbed and answered with the
// first id, and what no key can absorb (a second key for a job, no key, another body) is
// counted.
func TestSinkHonoursKeys(t *testing.T) {
	s := newSink()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	defer s.close()
	applied := 0
	s.setOnApply(func() { applied++ })
	first := post(t, s.url, "j1:writeback:summary_md", `{"job_id":"j1","payload":"a"}`)
	again := post(t, s.url, "j1:writeback:summary_md", `{"job_id":"j1","payload":"a"}`)
	if first != again || !strings.Contains(first, "sink-000001") {
		t.Fatalf("re-sent key answered %q, first %q; want the first id", again, first)
	}
	post(t, s.url, "j1:writeback:summary_md", `{"job_id":"j1","payload":"b"}`) // same key, another body
	post(t, s.url, "j1:writeback:other", `{"job_id":"j1","payload":"a"}`)      // the job under a second key
	post(t, s.url, "", `{"job_id":"j2","payload":"a"}`)
	post(t, s.url, "j3:writeback:summary_md", `{"job_id":"j3","payload":"a"}`)
	r := s.report()
	want := SinkReport{Deliveries: 6, KeysApplied: 3, DoubleWrites: 1, ResentAbsorbed: 2, Conflicts: 1, NoKey: 1}
	if r != want {
		t.Fatalf("report %+v, want %+v", r, want)
	}
	if applied != 4 || s.writesFor("j1") != 2 || s.writesFor("j3") != 1 {
		t.Fatalf("applied %d (j1 %d, j3 %d); want 4 (2, 1)", applied, s.writesFor("j1"), s.writesFor("j3"))
	}
}
