package pipeline

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The pipeline as a graph: which stage a job can go to from which, and how. Lint checks
// the graph; the coordinator's rules make the same moves at run time.

// routeNameRE matches a route name (handoff.v1 RouteChoice.name).
var routeNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// maxRoutes is the contract's cap on the routes offered to one stage (DeliverRequest.routes).
const maxRoutes = 32

// maxRouteDescription is the contract's cap on a route's description.
const maxRouteDescription = 500

// edgeKind is how a job moves along an edge.
type edgeKind int

const (
	edgeRoute    edgeKind = iota // a route the stage's agent chose
	edgeNext                     // the stage's next:
	edgeOrder                    // the next stage in file order
	edgePass                     // a judge's PASS: its next:, else file order
	edgeFail                     // a judge's FAIL: back to a stage it revises
	edgeFallback                 // rejected_role: the rail reroutes once
)

// edge is one possible move. to is a stage index, or -1 for escalate or end (sink says
// which).
type edge struct {
	from, to int
	sink     string
	kind     edgeKind
	route    string // the route's name, for edgeRoute
	path     string // where the edge is declared, for positions
}

// how describes an edge for messages ("by route \"billing\"").
func (e edge) how() string {
	switch e.kind {
	case edgeRoute:
		return fmt.Sprintf("by route %q", e.route)
	case edgeNext:
		return "by its next:"
	case edgeOrder:
		return "by file order"
	case edgePass:
		return "on a PASS"
	case edgeFail:
		return "on a FAIL"
	default:
		return "by its rejected_role: fallback"
	}
}

// edges lists every move out of each stage. Targets that are not stages are left out (the
// route-target rule reports them), except escalate and end, which are sinks.
func (p *Pipeline) edges() [][]edge {
	index := map[string]int{}
	for i, s := range p.Stages {
		if _, dup := index[s.Name]; !dup {
			index[s.Name] = i
		}
	}
	out := make([][]edge, len(p.Stages))
	add := func(from int, to string, kind edgeKind, route, path string) {
		if j, ok := index[to]; ok {
			out[from] = append(out[from], edge{from: from, to: j, kind: kind, route: route, path: path})
		} else if (to == ToEscalate || to == ToEnd) && kind == edgeRoute {
			out[from] = append(out[from], edge{from: from, to: -1, sink: to, kind: kind, route: route, path: path})
		}
	}
	for i := range p.Stages {
		s := &p.Stages[i]
		path := stagePath(i)
		after := func(kind, orderKind edgeKind) {
			switch {
			case s.Next != "":
				add(i, s.Next, kind, "", path+".next")
			case i+1 < len(p.Stages):
				add(i, p.Stages[i+1].Name, orderKind, "", path)
			}
		}
		switch {
		case kindOf(s) == KindJudge:
			after(edgePass, edgePass)
			for _, r := range s.ReviseStages() {
				add(i, r, edgeFail, "", path+".revise")
			}
		case len(s.Routes) > 0:
			for j, r := range s.Routes {
				add(i, r.To, edgeRoute, r.Name, fmt.Sprintf("%s.routes[%d].to", path, j))
			}
		default:
			after(edgeNext, edgeOrder)
		}
		if s.RejectedRole != "" {
			add(i, s.RejectedRole, edgeFallback, "", path+".rejected_role")
		}
	}
	return out
}

// routes checks a stage's routes, next: and rejected_role: on their own.
func (l *linter) routes(i int, s *Stage) {
	p, path, lbl := l.p, stagePath(i), label(s, i)
	target := func(to string) bool {
		_, _, ok := p.Stage(to)
		return ok
	}
	if len(s.Routes) > 0 {
		switch kindOf(s) {
		case KindJudge:
			l.errorAt("routes", fmt.Sprintf("judge %q has routes: a judge's verdict is its route (PASS moves on, FAIL goes back to the stage it revises)", s.Name), path+".routes", path)
		case KindWriteback:
			l.errorAt("routes", fmt.Sprintf("writeback stage %q has routes: a writeback stage has no agent to choose one", s.Name), path+".routes", path)
		}
		if s.Next != "" {
			l.errorAt("routes", fmt.Sprintf("%s has both routes and next: %s: its agent's route decides where the job goes; remove next", lbl, s.Next), path+".next", path)
		}
		if len(s.Routes) > maxRoutes {
			l.errorAt("routes", fmt.Sprintf("%s declares %d routes: at most %d", lbl, len(s.Routes), maxRoutes), path+".routes", path)
		}
	}
	first := map[string]int{}
	for j, r := range s.Routes {
		rp := fmt.Sprintf("%s.routes[%d]", path, j)
		switch {
		case r.Name == "":
			l.errorAt("route-name", fmt.Sprintf("route %d of %s has no name: add name: (e.g. billing), the word its agent answers", j+1, lbl), rp+".name", rp)
		case !routeNameRE.MatchString(r.Name) || len(r.Name) > maxNameLen:
			l.errorAt("route-name", fmt.Sprintf("%s has route %q, which is not a valid route name: use at most %d lowercase letters, digits, '_' and '-', starting with a letter", lbl, r.Name, maxNameLen), rp+".name", rp)
		default:
			if k, dup := first[r.Name]; dup {
				l.errorAt("duplicate-route", fmt.Sprintf("%s declares route %q twice (first as route %d): route names must be unique within a stage, or the rail could not tell which move its agent chose", lbl, r.Name, k+1), rp+".name", rp)
			} else {
				first[r.Name] = j
			}
		}
		switch {
		case strings.TrimSpace(r.Description) == "":
			l.errorAt("route-description", fmt.Sprintf("route %q of %s has no description: say in a sentence when to choose it (it becomes the text of its transfer tool)", r.Name, lbl), rp+".description", rp)
		case len(r.Description) > maxRouteDescription:
			l.errorAt("route-description", fmt.Sprintf("route %q of %s has a description of %d bytes: at most %d", r.Name, lbl, len(r.Description), maxRouteDescription), rp+".description", rp)
		}
		switch {
		case r.To == "":
			l.errorAt("route-target", fmt.Sprintf("route %q of %s has no to: name a stage, %s or %s", r.Name, lbl, ToEscalate, ToEnd), rp+".to", rp)
		case r.To == ToEscalate || r.To == ToEnd:
		case !target(r.To):
			l.errorAt("route-target", fmt.Sprintf("route %q of %s goes to %q, which is not a stage of this pipeline (stages: %s), nor %s or %s", r.Name, lbl, r.To, strings.Join(stageNames(p), ", "), ToEscalate, ToEnd), rp+".to", rp)
		}
	}
	if s.Next != "" && !target(s.Next) {
		l.errorAt("route-target", fmt.Sprintf("%s has next: %s, which is not a stage of this pipeline (stages: %s)", lbl, s.Next, strings.Join(stageNames(p), ", ")), path+".next", path)
	}
	if fb := s.RejectedRole; fb != "" {
		f, _, ok := p.Stage(fb)
		switch {
		case kindOf(s) == KindWriteback:
			l.errorAt("route-target", fmt.Sprintf("writeback stage %q has rejected_role: %s, but a writeback stage is served by the writeback service, not a runner that could reject its role", s.Name, fb), path+".rejected_role", path)
		case !ok:
			l.errorAt("route-target", fmt.Sprintf("%s has rejected_role: %s, which is not a stage of this pipeline (stages: %s)", lbl, fb, strings.Join(stageNames(p), ", ")), path+".rejected_role", path)
		case fb == s.Name:
			l.errorAt("route-target", fmt.Sprintf("%s names itself as its rejected_role fallback: name another stage (the same agent on another runner:, or another agent)", lbl), path+".rejected_role", path)
		case kindOf(f) != kindOf(s):
			l.errorAt("route-target", fmt.Sprintf("%s (a%s %s stage) falls back to %q, a%s %s stage: a fallback does the same kind of work", lbl, article(kindOf(s)), kindOf(s), fb, article(kindOf(f)), kindOf(f)), path+".rejected_role", path)
		}
	}
}

// graph checks the rules that need the whole graph: reachable, writeback-gate (for moves
// other than file order, which the writer rule checks), judge-revise (a judge reached from
// a stage it does not revise), cycle and route-end. It needs unique, valid stage names.
func (l *linter) graph() {
	p := l.p
	seen := map[string]bool{}
	for i, s := range p.Stages {
		if s.Name == "" || seen[s.Name] || p.bad[stagePath(i)] {
			return
		}
		seen[s.Name] = true
	}
	if len(p.Stages) == 0 {
		return
	}
	out := p.edges()

	// reachable: every stage, from the first.
	reach := walk(out, 0, nil)
	for i := 1; i < len(p.Stages); i++ {
		if !reach[i] {
			l.errorAt("reachable", fmt.Sprintf("%s is not reachable from the first stage %q: no route, next:, judge or file order leads to it, so no job ever runs it (route to it, or remove it)", label(&p.Stages[i], i), p.Stages[0].Name), stagePath(i)+".name", stagePath(i))
		}
	}

	for _, es := range out {
		for _, e := range es {
			if e.to < 0 {
				continue
			}
			from, to := &p.Stages[e.from], &p.Stages[e.to]
			// writeback-gate: only a judge's PASS (or another writeback) leads to a writeback.
			// File-order edges are the writer rule's (a judge before it, no agent between), a
			// FAIL into a writeback the judge-revise rule's.
			if kindOf(to) == KindWriteback && e.kind != edgeOrder && e.kind != edgePass && e.kind != edgeFail && kindOf(from) != KindWriteback {
				l.errorAt("writeback-gate", fmt.Sprintf("writeback stage %q is reachable from %s %s, without a judge's PASS: only a judge's PASS may lead to a writeback stage", to.Name, label(from, e.from), e.how()), e.path, stagePath(e.from))
			}
			// writeback-input: what a judge's PASS lets through is what it judged, so the
			// writeback it leads to writes that same artifact version.
			if kindOf(to) == KindWriteback && kindOf(from) == KindJudge && (e.kind == edgePass || e.kind == edgeOrder) && from.Input != to.Input {
				l.errorAt("writeback-input", fmt.Sprintf("writeback stage %q writes %s, but judge %q, whose PASS leads to it, judges %s: a PASS would let through an artifact no judge read; make the writeback's input %s", to.Name, to.Input, from.Name, from.Input, from.Input), stagePath(e.to)+".input", stagePath(e.to))
			}
			// judge-revise: a FAIL goes back to the stage whose work the judge judged, so every
			// stage that feeds a judge is one it revises (by file order too, once it lists several).
			if kindOf(to) == KindJudge && e.kind != edgeFail && e.kind != edgePass && kindOf(from) == KindAgent &&
				(e.kind != edgeOrder || len(to.Revisers) > 0) && len(to.ReviseStages()) > 0 && !slices.Contains(to.ReviseStages(), from.Name) {
				l.errorAt("judge-revise", fmt.Sprintf("judge %q is reached from %s %s, which it does not revise (revise: %s): a FAIL must go back to the stage whose work it judged, so add %q to its revise list", to.Name, label(from, e.from), e.how(), strings.Join(to.ReviseStages(), ", "), from.Name), e.path, stagePath(e.from))
			}
		}
	}

	l.cycles(out)

	// route-end: ending the job is a move only where no write is owed, i.e. on no path
	// from the first stage that has not yet passed a writeback.
	if !p.Writes() {
		return
	}
	owed := walk(out, 0, func(i int) bool { return kindOf(&p.Stages[i]) != KindWriteback })
	for i := range p.Stages {
		s := &p.Stages[i]
		if !owed[i] || kindOf(s) == KindWriteback {
			continue
		}
		// Ending by file order is the same move: a stage that is last in the file, with no
		// next: and no routes, ends a job that reached it unwritten.
		if _, ok := p.Next(s.Name); !ok && len(s.Routes) == 0 {
			l.errorAt("route-end", fmt.Sprintf("%s is the last stage and moves nowhere, but a job reaches it before its write: it would end the job unwritten; give it a next: (or routes) towards the judge, or move it before the writeback", label(s, i)), stagePath(i)+".name", stagePath(i))
		}
		for j, r := range s.Routes {
			if r.To == ToEnd {
				l.errorAt("route-end", fmt.Sprintf("route %q of %s ends the job, but a job reaches %q before its write: end only where no write is owed (after the writeback); route to the judge, or to %s for a person", r.Name, label(s, i), s.Name, ToEscalate), fmt.Sprintf("%s.routes[%d].to", stagePath(i), j), stagePath(i))
			}
		}
	}
}

// walk returns the stages reachable from start. expand, when set, says whether to follow a
// stage's own edges (a stage that is not expanded is still reached).
func walk(out [][]edge, start int, expand func(int) bool) map[int]bool {
	seen := map[int]bool{start: true}
	queue := []int{start}
	for len(queue) > 0 {
		i := queue[0]
		queue = queue[1:]
		if expand != nil && !expand(i) {
			continue
		}
		for _, e := range out[i] {
			if e.to >= 0 && !seen[e.to] {
				seen[e.to] = true
				queue = append(queue, e.to)
			}
		}
	}
	return seen
}

// cycles reports each cycle that passes through no judge: the strongly connected parts of
// the graph without its judges. A cycle only fixed moves form (next:, file order) traps a
// job for good: an error. One a route or a fallback is part of depends on the agents'
// choices: a warning, since max_bounces and the hop cap stop it at run time.
func (l *linter) cycles(out [][]edge) {
	p := l.p
	n := len(p.Stages)
	judge := func(i int) bool { return kindOf(&p.Stages[i]) == KindJudge }
	// Tarjan's algorithm over the stages that are not judges.
	index, low := make([]int, n), make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	next := 0
	var comps [][]int
	var strong func(v int)
	strong = func(v int) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, e := range out[v] {
			w := e.to
			if w < 0 || judge(w) {
				continue
			}
			if index[w] < 0 {
				strong(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var comp []int
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == v {
					break
				}
			}
			comps = append(comps, comp)
		}
	}
	for v := range n {
		if index[v] < 0 && !judge(v) {
			strong(v)
		}
	}
	for _, comp := range comps {
		in := map[int]bool{}
		for _, v := range comp {
			in[v] = true
		}
		first := slices.Min(comp)
		path := cyclePath(out, first, in)
		if path == nil {
			continue // a single stage without a move to itself
		}
		fixed := true
		for _, v := range comp {
			if len(p.Stages[v].Routes) > 0 || p.Stages[v].RejectedRole != "" {
				fixed = false
			}
		}
		names := make([]string, len(path))
		for i, v := range path {
			names[i] = p.Stages[v].Name
		}
		loop := strings.Join(names, " -> ")
		if fixed {
			l.errorAt("cycle", fmt.Sprintf("stages %s form a cycle that passes through no judge, and only fixed moves (next:, file order) form it: a job that enters it never leaves; break it with a route, or put a judge in it", loop), stagePath(first)+".name", stagePath(first))
		} else {
			l.warnAt("cycle", fmt.Sprintf("stages %s form a cycle that passes through no judge: only max_bounces (%d) and the hop cap stop a job going round it", loop, max(p.MaxBounces, 0)), stagePath(first)+".name", stagePath(first))
		}
	}
}

// cyclePath returns a shortest cycle from start back to start within the stages in, as the
// stage indices it visits (start first and last); nil when there is none.
func cyclePath(out [][]edge, start int, in map[int]bool) []int {
	prev := map[int]int{}
	queue := []int{start}
	visited := map[int]bool{}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, e := range out[v] {
			w := e.to
			if w < 0 || !in[w] {
				continue
			}
			if w == start {
				path := []int{start}
				for u := v; u != start; u = prev[u] {
					path = append(path, u)
				}
				slices.Reverse(path[1:])
				return append(path, start)
			}
			if !visited[w] {
				visited[w] = true
				prev[w] = v
				queue = append(queue, w)
			}
		}
	}
	return nil
}
