package support

import (
	"bufio"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"sync"

	handoffv1 "github.com/handoffhq/handoff/gen/handoff/v1"
	"github.com/handoffhq/handoff/services/agentrunner"
)

//go:embed helpcenter/*.md
var helpcenterFS embed.FS

// Article is one help-center article of the embedded corpus.
type Article struct {
	Key      string
	Title    string
	Keywords []string
	Text     string

	title, keywords, body map[string]int // stem -> count
}

var (
	corpusOnce sync.Once
	corpus     []*Article
	corpusErr  error
)

// Corpus returns the embedded help-center articles (services/agentrunner/support/helpcenter),
// sorted by key. Each file starts with front matter between "---" lines naming its citation
// key, title and keywords.
func Corpus() ([]*Article, error) {
	corpusOnce.Do(func() { corpus, corpusErr = loadCorpus(helpcenterFS) })
	return corpus, corpusErr
}

func loadCorpus(fsys fs.FS) ([]*Article, error) {
	paths, err := fs.Glob(fsys, "helpcenter/*.md")
	if err != nil {
		return nil, err
	}
	var out []*Article
	seen := map[string]string{}
	for _, p := range paths {
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		a, err := parseArticle(string(data))
		if err != nil {
			return nil, fmt.Errorf("help center %s: %w", p, err)
		}
		if prev, dup := seen[a.Key]; dup {
			return nil, fmt.Errorf("help center %s: key %q already used by %s", p, a.Key, prev)
		}
		seen[a.Key] = p
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("help center corpus is empty")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

var articleKey = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

func parseArticle(src string) (*Article, error) {
	sc := bufio.NewScanner(strings.NewReader(src))
	if !sc.Scan() || strings.TrimSpace(sc.Text()) != "---" {
		return nil, fmt.Errorf("no front matter (first line must be ---)")
	}
	a := &Article{}
	closed := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "---" {
			closed = true
			break
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("front matter line %q is not key: value", line)
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "key":
			a.Key = v
		case "title":
			a.Title = v
		case "keywords":
			for _, kw := range strings.Split(v, ",") {
				if kw = strings.TrimSpace(kw); kw != "" {
					a.Keywords = append(a.Keywords, kw)
				}
			}
		}
	}
	if !closed {
		return nil, fmt.Errorf("front matter is not closed with ---")
	}
	var body []string
	for sc.Scan() {
		body = append(body, strings.TrimSpace(sc.Text()))
	}
	a.Text = strings.TrimSpace(strings.Join(strings.Fields(strings.Join(body, " ")), " "))
	switch {
	case !articleKey.MatchString(a.Key):
		return nil, fmt.Errorf("citation key %q must match %s", a.Key, articleKey)
	case a.Title == "":
		return nil, fmt.Errorf("no title")
	case a.Text == "":
		return nil, fmt.Errorf("empty article")
	}
	a.title = counts(a.Title)
	a.keywords = counts(strings.Join(a.Keywords, " "))
	a.body = counts(a.Text)
	return a, nil
}

// stopwords never score: they say nothing about which article answers a ticket.
var stopwords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a about after again all also am an and any are as at back
		be been before being but by can could did do does for from get got had has have hello
		help hi how i if in into is it its just me my no not of on one only or our out please
		so some than thank thanks that the their them then there these they this to too two up
		us was we were what when where which who why will with would yes you your`) {
		stopwords[w] = true
	}
}

var wordRE = regexp.MustCompile(`[a-z0-9]+`)

// stem is a deliberately small stemmer: it folds plurals and -ed/-ing forms so "charged",
// "charges" and "charge" meet, which is all keyword scoring over six articles needs.
func stem(w string) string {
	for _, suf := range []string{"ing", "ed", "es", "s"} {
		if len(w) > len(suf)+2 && strings.HasSuffix(w, suf) {
			w = w[:len(w)-len(suf)]
			if n := len(w); (suf == "ing" || suf == "ed") && n > 3 && w[n-1] == w[n-2] && !strings.ContainsRune("lsz", rune(w[n-1])) {
				w = w[:n-1] // shipping -> shipp -> ship; billing stays bill
			}
			break
		}
	}
	if len(w) > 3 && strings.HasSuffix(w, "e") {
		w = w[:len(w)-1]
	}
	return w
}

// terms returns the distinct scoring stems of text, in order of appearance.
func terms(text string) []string {
	var out []string
	seen := map[string]bool{}
	for _, w := range wordRE.FindAllString(strings.ToLower(text), -1) {
		if stopwords[w] || len(w) < 2 {
			continue
		}
		if s := stem(w); !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func counts(text string) map[string]int {
	m := map[string]int{}
	for _, w := range wordRE.FindAllString(strings.ToLower(text), -1) {
		if !stopwords[w] && len(w) >= 2 {
			m[stem(w)]++
		}
	}
	return m
}

// MinScore is the score an article needs to count as a hit: one title or keyword match, or
// three mentions in the body.
const MinScore = 3

// Search scores every article against query and returns up to limit chunks, best first
// (ties by key). Score per distinct query term: 3 if it is in the title, 3 if it is in the
// keywords, plus its count in the body (capped at 3). An article is a hit when its score is
// at least MinScore and at least a third of the best score; no hit gives an empty slice.
func Search(query string, limit int) ([]Chunk, error) {
	arts, err := Corpus()
	if err != nil {
		return nil, err
	}
	qs := terms(query)
	var hits []Chunk
	for _, a := range arts {
		score := 0
		for _, q := range qs {
			if a.title[q] > 0 {
				score += 3
			}
			if a.keywords[q] > 0 {
				score += 3
			}
			score += min(a.body[q], 3)
		}
		if score >= MinScore {
			hits = append(hits, Chunk{Key: a.Key, Title: a.Title, Text: a.Text, Score: score})
		}
	}
	sort.Slice(hits, func(i, j int) bool {
		if hits[i].Score != hits[j].Score {
			return hits[i].Score > hits[j].Score
		}
		return hits[i].Key < hits[j].Key
	})
	if len(hits) > 0 {
		floor := (hits[0].Score + 2) / 3
		n := 0
		for _, h := range hits {
			if h.Score >= floor {
				hits[n] = h
				n++
			}
		}
		hits = hits[:n]
	}
	if limit > 0 && len(hits) > limit {
		hits = hits[:limit]
	}
	return hits, nil
}

// retrieveAgent searches the help-center corpus for the intake's question and category and
// writes chunks.v1 (no_hit when nothing scores). Offered routes, it answers hit or no_hit.
type retrieveAgent struct{ card }

// NewRetrieve returns the retrieve agent (card "retrieve", tools kb.search).
func NewRetrieve() agentrunner.Agent {
	return &retrieveAgent{card{Name: StageRetrieve, Tools: []string{ToolKBSearch}}}
}

// MaxChunks is how many chunks retrieve returns at most.
const MaxChunks = 3

// Run implements agentrunner.Agent.
func (a *retrieveAgent) Run(ctx context.Context, in agentrunner.Input) (*handoffv1.StageResult, error) {
	var it Intake
	if err := readJSON(ctx, in, TypeIntake, &it); err != nil {
		return nil, err
	}
	query := strings.TrimSpace(it.Question + " " + strings.ReplaceAll(it.Category, "_", " "))
	if it.Category == "general" {
		query = strings.TrimSpace(it.Question)
	}
	attempt := &handoffv1.ToolAttempt{Name: ToolKBSearch, Stage: StageRetrieve}
	hits, err := Search(query, MaxChunks)
	if err != nil {
		attempt.ErrorCode = "corpus_unavailable"
		attempt.Detail = clip(err.Error(), 500)
		return nil, fmt.Errorf("kb.search: %w", err)
	}
	attempt.Ok = true
	out := Chunks{Query: clip(query, 500), Chunks: hits, NoHit: len(hits) == 0}
	if out.Chunks == nil {
		out.Chunks = []Chunk{}
	}
	keys := make([]string, len(hits))
	for i, h := range hits {
		keys[i] = h.Key
	}
	var open []string
	hint := "draft an internal summary citing " + strings.Join(keys, ", ")
	route := choose(in, RouteHit, fmt.Sprintf("%d article(s) match: %s", len(hits), strings.Join(keys, ", ")), handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL)
	if out.NoHit {
		attempt.Detail = "no article matched"
		open = append(open, "no help-center article matches this ticket: a human must answer it")
		hint = "no_hit: nothing to cite; escalate to a human rather than drafting from memory"
		route = choose(in, RouteNoHit, fmt.Sprintf("no article matches %q", clip(query, 200)), handoffv1.RoutePriority_ROUTE_PRIORITY_NORMAL)
		if route != nil {
			hint = "no_hit: nothing to cite; say so in a note rather than drafting from memory"
		}
	} else {
		attempt.Detail = clip(fmt.Sprintf("%d article(s): %s", len(hits), strings.Join(keys, ", ")), 500)
	}
	art, err := putJSON(ctx, in, TypeChunks, SchemaChunks, out)
	if err != nil {
		return nil, err
	}
	return &handoffv1.StageResult{
		Artifacts:      []*handoffv1.Artifact{art},
		ToolsTried:     []*handoffv1.ToolAttempt{attempt},
		SpentUsdMicros: SpendRetrieve,
		OpenQuestions:  questions(open...),
		NextHint:       clip(hint, 1000),
		Route:          route,
	}, nil
}
