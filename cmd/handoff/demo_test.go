package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the README's first command in-process and checks what it promises: the
// job completes through one judge FAIL, a revision and a PASS; every hop line of a run
// carries that run's one trace id; the resubmitted job answers DUPLICATE at every hop; and
// exactly one external write happened.
func TestDemo(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", t.TempDir()}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	runs := strings.Split(text, "\nrun ")
	if len(runs) != 3 {
		t.Fatalf("want two runs in the output, got:\n%s", text)
	}
	if !strings.Contains(text, "r = judge revisions left, h = hops left") {
		t.Errorf("the demo does not explain its wallet column (r2 h11):\n%s", text)
	}
	hopLine := regexp.MustCompile(`(?m)^\s+(\d+)\s+(\w+)\s+(\w+)\s+(.*?)\s+(\$\S+ r\d+ h\d+)\s+([0-9a-f]{32})$`)
	for i, run := range runs[1:] {
		trace := regexp.MustCompile(`trace ([0-9a-f]{32})`).FindStringSubmatch(run)
		if trace == nil {
			t.Fatalf("run %d has no trace id:\n%s", i+1, run)
		}
		lines := hopLine.FindAllStringSubmatch(run, -1)
		if len(lines) != 7 {
			t.Fatalf("run %d: %d hop lines, want 7 (intake, retrieve, draft, judge FAIL, draft, judge PASS, writeback):\n%s", i+1, len(lines), run)
		}
		var verdicts []string
		for _, l := range lines {
			if l[6] != trace[1] {
				t.Errorf("run %d hop %s (%s) on trace %s, want %s", i+1, l[1], l[2], l[6], trace[1])
			}
			if i == 1 && l[3] != "DUPLICATE" {
				t.Errorf("second run hop %s (%s) acked %s, want DUPLICATE", l[1], l[2], l[3])
			}
			if strings.Contains(l[4], "verdict") {
				verdicts = append(verdicts, l[4])
			}
		}
		if len(verdicts) != 2 || !strings.HasPrefix(verdicts[0], "verdict FAIL citation_missing") || verdicts[1] != "verdict PASS" {
			t.Errorf("run %d verdicts %q; want FAIL citation_missing then PASS", i+1, verdicts)
		}
	}
	if !strings.Contains(text, "external writes in the ledger: 1 ") {
		t.Fatalf("want exactly one external write:\n%s", text)
	}
	if strings.Contains(text, "[handoff.") {
		t.Errorf("without --v2-stage every stage reads handoff.v1 and no hop line names a version:\n%s", text)
	}
}

// TestDemoV2Stage runs `handoff demo --v2-stage draft`: the draft agent declares handoff.v2
// as well, so its hops are sent v2 (their lines say so) and the others v1, and the job
// completes as without the flag.
func TestDemoV2Stage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", t.TempDir(), "--v2-stage", "draft"}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	first := strings.Split(out.String(), "\nsubmitting")[0]
	hopLine := regexp.MustCompile(`(?m)^\s+(\d+)\s+(\w+)\s+(\w+)\s+(.*?)\s+(\$\S+ r\d+ h\d+)\s+([0-9a-f]{32})$`)
	lines := hopLine.FindAllStringSubmatch(first, -1)
	if len(lines) != 7 {
		t.Fatalf("%d hop lines, want 7:\n%s", len(lines), first)
	}
	for _, l := range lines {
		v2 := strings.HasPrefix(l[4], "[handoff.v2] ")
		if v2 != (l[2] == "draft") || l[3] != "ACCEPTED" {
			t.Errorf("hop %s %s %s %q: want ACCEPTED, and [handoff.v2] exactly on draft", l[1], l[2], l[3], l[4])
		}
	}
	if !strings.Contains(first, "=> COMPLETED after 7 hops") {
		t.Errorf("job did not complete:\n%s", first)
	}
	errb.Reset()
	if code := runDemo([]string{"--data", t.TempDir(), "--v2-stage", "nosuch"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), `"nosuch"`) {
		t.Errorf("--v2-stage nosuch: exit %d, stderr %q; want a failure naming the value", code, errb.String())
	}
}

// TestDemoTriage runs `handoff demo --pipeline support-triage` in-process: a billing, a
// technical and an unclear ticket; every hop line carries the route the rail took after it
// and its run's one trace id; the billing and the technical ticket take their desks'
// routes and are written once each; the unclear one is handed to a person by intake's route.
func TestDemoTriage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", t.TempDir(), "--pipeline", "support-triage"}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	runs := strings.Split(text, "\nticket ")
	if len(runs) != 4 {
		t.Fatalf("want three runs in the output, got:\n%s", text)
	}
	hopLine := regexp.MustCompile(`(?m)^\s+(\d+)\s+(\S+)\s+(ACCEPTED|DUPLICATE|REJECTED_\w+)\s+(\S+ -> \S+)\s+(.*?)\s+(\$\S+ r\d+ h\d+)\s+([0-9a-f]{32})$`)
	want := []struct {
		routes []string
		end    string
	}{
		{[]string{"billing -> billing-retrieve", "hit -> billing-draft", "next -> judge", "revise -> billing-draft", "next -> judge", "pass -> writeback", "next -> end"},
			"=> COMPLETED after 7 hops"},
		{[]string{"technical -> technical-retrieve", "hit -> technical-draft", "next -> judge", "revise -> technical-draft", "next -> judge", "pass -> writeback", "next -> end"},
			"=> COMPLETED after 7 hops"},
		{[]string{"unclear -> escalate"}, "=> ESCALATED after 1 hops"},
	}
	for i, run := range runs[1:] {
		trace := regexp.MustCompile(`trace ([0-9a-f]{32})`).FindStringSubmatch(run)
		if trace == nil {
			t.Fatalf("run %d has no trace id:\n%s", i+1, run)
		}
		var routes []string
		for _, l := range hopLine.FindAllStringSubmatch(run, -1) {
			routes = append(routes, l[4])
			if l[7] != trace[1] {
				t.Errorf("run %d hop %s on trace %s, want %s", i+1, l[1], l[7], trace[1])
			}
		}
		if strings.Join(routes, "|") != strings.Join(want[i].routes, "|") || !strings.Contains(run, want[i].end) {
			t.Errorf("run %d: routes %q, want %q ending %q:\n%s", i+1, routes, want[i].routes, want[i].end, run)
		}
	}
	if !strings.Contains(runs[3], "ESCALATED ROUTED -> support-leads") {
		t.Errorf("the unclear ticket's escalation is not shown:\n%s", runs[3])
	}
	if !strings.Contains(text, "external writes in the ledger: 2 ") {
		t.Fatalf("want exactly two external writes:\n%s", text)
	}
	if code := runDemo([]string{"--data", t.TempDir(), "--pipeline", "nope"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `--pipeline "nope"`) {
		t.Errorf("--pipeline nope: exit %d, stderr %q; want 2 naming the value", code, errb.String())
	}
}

// TestDemoResearchBrief: `handoff demo --pipeline research-brief` exits 0 and shows both
// branches with overlapping times, the merge's verdict, the sub-job returning its artifact
// and one write.
func TestDemoResearchBrief(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", t.TempDir(), "--pipeline", "research-brief"}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	// The branches side by side: each one's start and end, from the fan-out's start.
	row := regexp.MustCompile(`(?m)^ (policy|history)\s+(\S+)\s+COMPLETED\s+1\s+(\S+)\s+(\S+)$`)
	rows := row.FindAllStringSubmatch(text, -1)
	if len(rows) != 2 {
		t.Fatalf("want the two branches side by side, got:\n%s", text)
	}
	span := func(r []string) (time.Duration, time.Duration) {
		s, err1 := time.ParseDuration(r[3])
		e, err2 := time.ParseDuration(r[4])
		if err1 != nil || err2 != nil {
			t.Fatalf("branch row %q: times %v %v", r[0], err1, err2)
		}
		return s, e
	}
	s1, e1 := span(rows[0])
	s2, e2 := span(rows[1])
	if !(s1 < e2 && s2 < e1) {
		t.Errorf("branches %v and %v did not overlap", rows[0], rows[1])
	}
	for _, want := range []string{
		`policy-lookup\s+policy\s+STAGE_RESULT\s+policy_notes\.v1`,
		`history-lookup\s+history\s+STAGE_RESULT\s+account_history\.v1`,
		`brief\s+VERDICT\s+verdict PASS`,
		`draft\s+SUBJOB_ENDED\s+run run_\S+-draft-0`,
		`sub-job draft: run \S+ of pipeline support-ticket, COMPLETED after \d+ hops on the parent's wallet; returned summary_md\.v1`,
		`RECEIPT\s+receipt ledger-000001 key tkt_18422:writeback:summary_md`,
		`external writes in the ledger: 1\n`,
	} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("output misses %s:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "RECEIPT "); n != 1 {
		t.Errorf("%d receipts shown, want one write", n)
	}
}

// TestDemoResearchBriefExplain: --explain on the fan-out demo answers each branch's hop
// from its own package, ack and result, though the branches' events interleave.
func TestDemoResearchBriefExplain(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", t.TempDir(), "--pipeline", "research-brief", "--explain"}, &out, &errb); code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	text := out.String()
	for _, stage := range []string{"policy-lookup", "history-lookup", "brief", "writeback"} {
		if !regexp.MustCompile(`(?m)^\s+\d+\s+` + stage + `\s+ACCEPTED\s+same job_id\s+OK`).MatchString(text) {
			t.Errorf("no accepted hop of %s explained:\n%s", stage, text)
		}
	}
	if strings.Contains(text, "UNKNOWN") || !strings.Contains(text, "violations: none") {
		t.Errorf("an answer unknown or a violation on a clean fan-out run:\n%s", text)
	}
}

func TestDemoExplainRefusedForTriage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo([]string{"--data", t.TempDir(), "--pipeline", "support-triage", "--explain"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--explain") {
		t.Fatalf("exit %d, stderr %q; want 2 naming --explain", code, errb.String())
	}
}
