package pipeline

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/handoffhq/handoff/internal/pii"
)

// Name patterns, aligned with the handoff.v1 contract where a name crosses the wire
// (HandoffPackage.stage, Artifact.type/schema_version, Failure.code, WriteRequest.target).
var (
	pipelineNameRE  = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	stageNameRE     = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)
	artifactTypeRE  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	schemaVersionRE = regexp.MustCompile(`^([a-z][a-z0-9_]*)\.v[0-9]+$`)
	criterionRE     = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	toolNameRE      = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)
	systemNameRE    = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)
)

const maxNameLen = 64

// Lint checks a pipeline against the structure and workshop rules and returns every
// problem found, sorted by position. It works on a parsed pipeline (problems point at the
// offending YAML node) and on one built in code (problems point at Stage.Line, or carry no
// position).
func Lint(p *Pipeline) []Problem {
	if p == nil {
		return nil
	}
	l := &linter{p: p}
	l.pipeline()
	l.pii()
	l.mcpServers()
	l.catalogue()
	l.stages()
	l.fanout()
	l.writers()
	l.oneStage()
	l.graph()
	sortProblems(l.out)
	return l.out
}

type linter struct {
	p   *Pipeline
	out []Problem
	// ungated holds the stages already reported for running between a judge and a
	// writeback, so a second writeback does not report them again.
	ungated map[int]bool
}

// errorAt reports an error at the first of paths that has a position. Nothing is reported
// when one of the paths already has a decode problem (a field of the wrong YAML kind).
func (l *linter) errorAt(rule, msg string, paths ...string) {
	l.report(SeverityError, rule, msg, paths...)
}

func (l *linter) warnAt(rule, msg string, paths ...string) {
	l.report(SeverityWarning, rule, msg, paths...)
}

func (l *linter) report(sev, rule, msg string, paths ...string) {
	for _, path := range paths {
		if l.p.bad[path] {
			return
		}
	}
	at := l.at(paths...)
	l.out = append(l.out, Problem{File: l.p.Source, Line: at.line, Col: at.col, Rule: rule, Message: msg, Severity: sev})
}

// at finds the position of the first path that has one. A pipeline built in code has no
// positions: a stage path falls back to the stage's Line.
func (l *linter) at(paths ...string) position {
	for _, path := range paths {
		if at, ok := l.p.pos[path]; ok && at.line > 0 {
			return at
		}
	}
	for _, path := range paths {
		var i int
		if _, err := fmt.Sscanf(path, "stages[%d]", &i); err == nil && i >= 0 && i < len(l.p.Stages) && l.p.Stages[i].Line > 0 {
			return position{l.p.Stages[i].Line, 1}
		}
	}
	return position{}
}

// onLine is " on line N" for a stage, or "" when the stage has no position.
func (l *linter) onLine(i int) string {
	if at := l.at(stagePath(i)); at.line > 0 {
		return fmt.Sprintf(" on line %d", at.line)
	}
	return ""
}

// lineOf is " (line N)" for a stage, for messages that name another stage.
func (l *linter) lineOf(i int) string {
	if at := l.at(stagePath(i)); at.line > 0 {
		return fmt.Sprintf(" (line %d)", at.line)
	}
	return ""
}

func stagePath(i int) string { return fmt.Sprintf("stages[%d]", i) }

func (l *linter) pipeline() {
	p := l.p
	switch {
	case p.Name == "":
		l.errorAt("pipeline-name", "the pipeline has no name: add name: with lowercase letters, digits and '-' (e.g. support-ticket)", "name", "")
	case !pipelineNameRE.MatchString(p.Name) || len(p.Name) > maxNameLen:
		l.errorAt("pipeline-name", fmt.Sprintf("pipeline name %q is not valid: use at most %d lowercase letters, digits and '-', starting with a letter (e.g. support-ticket)", p.Name, maxNameLen), "name")
	}

	switch {
	case p.MaxHops == 0:
		l.errorAt("max-hops", "max_hops is required and must be greater than 0: set how many hops a job may take before it escalates (e.g. max_hops: 12), so no job bounces between stages forever", "max_hops", "")
	case p.MaxHops < 0:
		l.errorAt("max-hops", fmt.Sprintf("max_hops is %d: it must be greater than 0 (the number of hops a job may take before it escalates)", p.MaxHops), "max_hops", "")
	case len(p.Stages) > 0 && p.MaxHops < len(p.Stages):
		l.warnAt("max-hops", fmt.Sprintf("max_hops is %d but the pipeline has %d stages: every job escalates before it reaches the last stage", p.MaxHops, len(p.Stages)), "max_hops")
	}

	hasJudge := slices.ContainsFunc(p.Stages, func(s Stage) bool { return s.Judges() })
	switch {
	case p.MaxRevisions < 0:
		l.errorAt("max-revisions", fmt.Sprintf("max_revisions is %d: it must be 0 or more (how many judge FAILs go back for revision before the job escalates)", p.MaxRevisions), "max_revisions")
	case p.MaxRevisions > 0 && !hasJudge && len(p.Stages) > 0:
		l.warnAt("max-revisions", fmt.Sprintf("max_revisions is %d but no stage is a judge: nothing ever sends work back for revision", p.MaxRevisions), "max_revisions")
	}
	if p.StaleRevision != "" && p.StaleRevision != StaleRevise && p.StaleRevision != StaleEscalate {
		l.errorAt("stale-revision", fmt.Sprintf("stale_revision is %q: it must be %q (back to the reviser once, the default) or %q (escalate STALE_PLAN at once)", p.StaleRevision, StaleRevise, StaleEscalate), "stale_revision")
	}
	if p.MaxBounces < 0 {
		l.errorAt("max-bounces", fmt.Sprintf("max_bounces is %d: it must be 0 or more (how often a job may be handed back between the same two stages before it escalates; default %d)", p.MaxBounces, DefaultMaxBounces), "max_bounces")
	}

	g := p.Escalation.MaxGrant
	for _, c := range []struct {
		key      string
		v, limit int64
	}{{"hops", int64(g.Hops), 1000}, {"revisions", int64(g.Revisions), 100}, {"usd_micros", g.USDMicros, 1 << 62}} {
		if c.v < 0 || c.v > c.limit {
			l.errorAt("max-grant", fmt.Sprintf("escalation.max_grant.%s is %d: it must be between 0 and %d (the most a person may give a run in one return)", c.key, c.v, c.limit), "escalation.max_grant."+c.key, "escalation.max_grant")
		}
	}
	if w := p.Escalation.Webhook; w != "" {
		if u, err := url.Parse(w); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			l.errorAt("escalation-webhook", fmt.Sprintf("escalation.webhook %q is not an http(s) URL: it is where each escalation is POSTed (e.g. https://desk.example/hooks/handoff)", w), "escalation.webhook", "escalation")
		}
	}
	switch p.Escalation.WhenFull {
	case "", WhenFullShed, WhenFullHuman:
	default:
		l.errorAt("when-full", fmt.Sprintf("escalation.when_full is %q: use %s (refuse new jobs while max_open_escalations runs wait) or %s (send them straight to a person)", p.Escalation.WhenFull, WhenFullShed, WhenFullHuman), "escalation.when_full", "escalation")
	}
	if p.Escalation.MaxOpen < 0 {
		l.errorAt("max-open-escalations", fmt.Sprintf("escalation.max_open_escalations is %d: it must be 0 (no cap) or more (how many runs may wait for a person before intake sheds load)", p.Escalation.MaxOpen), "escalation.max_open_escalations", "escalation")
	}
	if strings.TrimSpace(p.Escalation.Route) == "" {
		l.errorAt("escalation", "escalation.route is required: it is where the rail hands a job it stops (hop cap, revisions used up, empty wallet, rejected package), e.g. escalation: {route: support-leads}", "escalation.route", "escalation", "")
	}
}

func (l *linter) catalogue() {
	p := l.p
	first := map[string]int{}
	unreadTools := false // a stage's tools could not be read: unused-tool would guess
	for i := range p.Stages {
		if p.bad[stagePath(i)+".tools"] || p.bad[stagePath(i)] {
			unreadTools = true
		}
	}
	for i, t := range p.Tools {
		path := fmt.Sprintf("tools[%d]", i)
		label := fmt.Sprintf("tool %d of the catalogue", i+1)
		switch {
		case t.Name == "":
			l.errorAt("tool-decl", label+" has no name: add name: (e.g. crm.patch)", path+".name", path)
		case !toolNameRE.MatchString(t.Name) || len(t.Name) > 128:
			l.errorAt("tool-decl", fmt.Sprintf("tool name %q is not valid: use letters, digits, '_', '.' and '-', starting with a letter (e.g. crm.patch)", t.Name), path+".name", path)
		default:
			label = fmt.Sprintf("tool %q", t.Name)
			if j, dup := first[t.Name]; dup {
				l.errorAt("duplicate-tool", fmt.Sprintf("tool %q is declared twice in the catalogue (first at%s): declare each tool once", t.Name, l.toolLine(j)), path+".name", path)
			} else {
				first[t.Name] = i
			}
		}
		switch t.Access {
		case AccessRead, AccessWrite:
		case "":
			l.errorAt("tool-decl", label+" has no access: add access: read or access: write", path+".access", path)
		default:
			l.errorAt("tool-decl", fmt.Sprintf("%s has access %q: use read or write", label, t.Access), path+".access", path)
		}
		switch {
		case t.System == "":
			l.errorAt("tool-decl", label+" has no system: name the external system it reads or writes (e.g. system: crm)", path+".system", path)
		case !systemNameRE.MatchString(t.System) || len(t.System) > maxNameLen:
			l.errorAt("tool-decl", fmt.Sprintf("%s has system %q, which is not a valid name: use lowercase letters, digits, '_' and '-', starting with a letter", label, t.System), path+".system", path)
		}
		if t.Name != "" && len(p.Stages) > 0 && !unreadTools && !p.holds(t.Name) {
			l.warnAt("unused-tool", fmt.Sprintf("tool %q is in the catalogue but no stage holds it", t.Name), path+".name", path)
		}
	}
}

// mcpServers checks the tool servers and the catalogue's references to them.
func (l *linter) mcpServers() {
	p := l.p
	names := map[string]bool{}
	for i, m := range p.MCPServers {
		path := fmt.Sprintf("mcp_servers[%d]", i)
		switch {
		case m.Name == "" || !systemNameRE.MatchString(m.Name) || len(m.Name) > maxNameLen:
			l.errorAt("mcp-server", fmt.Sprintf("MCP server %d has name %q: use lowercase letters, digits, '_' and '-', starting with a letter", i+1, m.Name), path+".name", path)
		case names[m.Name]:
			l.errorAt("mcp-server", fmt.Sprintf("MCP server %q is declared twice", m.Name), path+".name", path)
		}
		names[m.Name] = true
		switch {
		case len(m.Command) == 0 && m.URL == "":
			l.errorAt("mcp-server", fmt.Sprintf("MCP server %q has neither command: (stdio) nor url: (streamable HTTP)", m.Name), path)
		case len(m.Command) > 0 && m.URL != "":
			l.errorAt("mcp-server", fmt.Sprintf("MCP server %q has both command: and url:; give one", m.Name), path+".url", path)
		case m.URL != "" && !strings.HasPrefix(m.URL, "http://") && !strings.HasPrefix(m.URL, "https://"):
			l.errorAt("mcp-server", fmt.Sprintf("MCP server %q has url %q: want an http:// or https:// URL", m.Name, m.URL), path+".url", path)
		}
	}
	for i, t := range p.Tools {
		if t.MCP == nil {
			continue
		}
		path := fmt.Sprintf("tools[%d].mcp", i)
		switch {
		case t.MCP.Server == "" || t.MCP.Tool == "":
			l.errorAt("tool-mcp", fmt.Sprintf("tool %q: mcp needs both server: and tool:", t.Name), path)
		case !names[t.MCP.Server]:
			l.errorAt("tool-mcp", fmt.Sprintf("tool %q is served by MCP server %q, which mcp_servers does not declare", t.Name, t.MCP.Server), path+".server", path)
		}
	}
	models := map[string]bool{}
	for i, pr := range p.Prices {
		path := fmt.Sprintf("prices[%d]", i)
		switch {
		case pr.Model == "":
			l.errorAt("price", fmt.Sprintf("price %d has no model: name the model as its server knows it", i+1), path+".model", path)
		case models[pr.Model]:
			l.errorAt("price", fmt.Sprintf("model %q is priced twice", pr.Model), path+".model", path)
		}
		models[pr.Model] = true
		if pr.PromptMicrosPer1K < 0 || pr.CompletionMicrosPer1K < 0 {
			l.errorAt("price", fmt.Sprintf("model %q has a negative price: micro-USD per 1000 tokens are 0 or more", pr.Model), path)
		}
	}
	for i, s := range p.Stages {
		if s.MaxToolRounds < 0 {
			l.errorAt("max-tool-rounds", fmt.Sprintf("%s has max_tool_rounds %d: it must be 0 (the agent's default) or more", label(&p.Stages[i], i), s.MaxToolRounds), stagePath(i)+".max_tool_rounds", stagePath(i))
		}
	}
}

func (l *linter) toolLine(i int) string {
	if at := l.at(fmt.Sprintf("tools[%d]", i)); at.line > 0 {
		return fmt.Sprintf(" line %d", at.line)
	}
	return " an earlier entry"
}

// label names a stage in messages.
func label(s *Stage, i int) string {
	if s.Name != "" {
		return fmt.Sprintf("stage %q", s.Name)
	}
	return fmt.Sprintf("stage %d", i+1)
}

func kindOf(s *Stage) string {
	if s.Kind == "" {
		return KindAgent
	}
	return s.Kind
}

func (l *linter) stages() {
	p := l.p
	if len(p.Stages) == 0 {
		l.errorAt("no-stages", "the pipeline has no stages: list them under stages:, in the order a job runs through them", "stages", "")
		return
	}
	firstName := map[string]int{}
	// A rejected_role fallback does the work of the stage that names it, so it may read
	// what that stage reads (the job's input, for a fallback of the first stage).
	fallbackInputs := map[string][]string{}
	for _, s := range p.Stages {
		if s.RejectedRole != "" {
			fallbackInputs[s.RejectedRole] = append(fallbackInputs[s.RejectedRole], s.Input)
		}
	}
	var outputs []string       // schema versions output by the stages so far
	var unversioned []string   // types of earlier outputs with no usable version
	names := map[string]bool{} // every stage name, top-level and in branches
	for _, s := range p.Stages {
		names[s.Name] = true
	}
	var branchOutputs []string // what the last parallel stage's branches output
	for i := range p.Stages {
		s := &p.Stages[i]
		path := stagePath(i)
		lbl := label(s, i)

		// Names.
		switch {
		case s.Name == "":
			l.errorAt("stage-name", lbl+" has no name: add name: (e.g. draft)", path+".name", path)
		case !stageNameRE.MatchString(s.Name) || len(s.Name) > maxNameLen:
			l.errorAt("stage-name", fmt.Sprintf("stage name %q is not valid: use at most %d lowercase letters, digits, '_' and '-', starting with a letter", s.Name, maxNameLen), path+".name", path)
		case s.Name == ToEscalate || s.Name == ToEnd:
			l.errorAt("stage-name", fmt.Sprintf("stage name %q is reserved: routes use %s and %s as targets; name the stage after what it does", s.Name, ToEscalate, ToEnd), path+".name", path)
		default:
			if j, dup := firstName[s.Name]; dup {
				l.errorAt("duplicate-stage", fmt.Sprintf("stage name %q is used twice (first%s): stage names must be unique", s.Name, l.onLine(j)), path+".name", path)
			} else {
				firstName[s.Name] = i
			}
		}
		if s.Agent != "" && (!stageNameRE.MatchString(s.Agent) || len(s.Agent) > maxNameLen) {
			l.errorAt("agent-name", fmt.Sprintf("%s has agent %q, which is not a valid agent name: use lowercase letters, digits, '_' and '-', starting with a letter", lbl, s.Agent), path+".agent", path)
		}

		// Kind.
		kind := kindOf(s)
		switch kind {
		case KindAgent, KindJudge, KindWriteback, KindParallel, KindMerge, KindSubJob:
		default:
			l.errorAt("stage-kind", fmt.Sprintf("%s has kind %q: use agent (the default), judge, writeback, parallel, merge or subjob", lbl, s.Kind), path+".kind", path)
		}

		// Input.
		switch {
		case kind == KindMerge:
			// A merge reads every branch's result; input: names one of them, if any.
			l.merge(i, s, branchOutputs)
		case s.Input == "":
			l.errorAt("stage-input", fmt.Sprintf("%s has no input: name the schema version of the artifact it reads (e.g. input: chunks.v1)", lbl), path+".input", path)
		case !schemaVersionRE.MatchString(s.Input):
			l.errorAt("stage-input", fmt.Sprintf("%s reads %q, which is not a schema version: use type.vN (e.g. chunks.v1)", lbl, s.Input), path+".input", path)
		case i > 0 && !slices.Contains(outputs, s.Input) && !slices.Contains(unversioned, versionType(s.Input)) && !slices.Contains(unversioned, "") && !slices.Contains(fallbackInputs[s.Name], s.Input):
			l.errorAt("stage-input", fmt.Sprintf("%s reads %s, but no stage before it outputs %s (earlier outputs: %s)", lbl, s.Input, s.Input, orWord(strings.Join(outputs, ", "), "none")), path+".input", path)
		}

		if kind == KindParallel {
			branchOutputs = l.parallel(i, s, names)
			outputs = append(outputs, branchOutputs...)
			l.routes(i, s)
			continue
		}
		if kind == KindSubJob {
			l.subjob(i, s)
		}

		// Output artifact: a type, and a schema version of that type.
		o := s.Output
		switch {
		case o.Type == "":
			l.errorAt("artifact-type", fmt.Sprintf("%s names no output artifact type: a stage that cannot name its output is not ready to be an agent (add output: {type: ..., schema_version: ....v1})", lbl), path+".output.type", path+".output", path)
		case !artifactTypeRE.MatchString(o.Type) || len(o.Type) > maxNameLen:
			l.errorAt("artifact-type", fmt.Sprintf("%s has output type %q, which is not a valid artifact type: use one noun of lowercase letters, digits and '_' (e.g. summary_md)", lbl, o.Type), path+".output.type", path+".output", path)
		}
		versioned := false
		switch m := schemaVersionRE.FindStringSubmatch(o.SchemaVersion); {
		case o.SchemaVersion == "" && o.Type == "":
			// artifact-type already asks for both.
		case o.SchemaVersion == "":
			hint := ""
			if artifactTypeRE.MatchString(o.Type) {
				hint = fmt.Sprintf(" (add schema_version: %s.v1)", o.Type)
			}
			l.errorAt("artifact-version", fmt.Sprintf("%s: output type %s has no schema version%s: every artifact is versioned so the stage that reads it can check its shape", lbl, o.Type, hint), path+".output.schema_version", path+".output", path)
		case m == nil || len(o.SchemaVersion) > maxNameLen:
			l.errorAt("artifact-version", fmt.Sprintf("%s: output schema_version %q is not a version: use the type followed by .vN (e.g. %s.v1)", lbl, o.SchemaVersion, orExample(o.Type)), path+".output.schema_version", path+".output", path)
		case o.Type != "" && m[1] != o.Type:
			l.errorAt("artifact-version", fmt.Sprintf("%s: output schema_version %s is not a version of type %s: use %s.vN", lbl, o.SchemaVersion, o.Type, o.Type), path+".output.schema_version", path+".output", path)
		default:
			outputs = append(outputs, o.SchemaVersion)
			versioned = true
		}
		if !versioned {
			unversioned = append(unversioned, o.Type)
		}

		// Tools held.
		seenTool := map[string]bool{}
		for j, name := range s.Tools {
			tp := fmt.Sprintf("%s.tools[%d]", path, j)
			if seenTool[name] {
				l.errorAt("duplicate-tool", fmt.Sprintf("%s lists tool %q twice", lbl, name), tp, path+".tools", path)
				continue
			}
			seenTool[name] = true
			if _, ok := p.Tool(name); !ok {
				msg := fmt.Sprintf("%s holds tool %q, which is not in the tool catalogue", lbl, name)
				if len(p.Tools) > 0 {
					msg += " (" + strings.Join(toolNames(p.Tools), ", ") + ")"
				}
				l.errorAt("unknown-tool", msg+": declare it under tools: with its access and system", tp, path+".tools", path)
			}
		}

		// Criteria.
		if len(s.Criteria) == 0 && !p.bad[path+".criteria"] {
			l.warnAt("criteria", fmt.Sprintf("%s has no evaluator criteria: nothing says what a good %s is", lbl, orWord(o.Type, "output")), path+".criteria", path)
		}
		seenCrit := map[string]bool{}
		for j, c := range s.Criteria {
			cp := fmt.Sprintf("%s.criteria[%d]", path, j)
			switch {
			case !criterionRE.MatchString(c) || len(c) > maxNameLen:
				l.errorAt("criteria", fmt.Sprintf("%s has criterion %q, which is not a code: use lowercase letters, digits and '_', starting with a letter (e.g. cites_keys)", lbl, c), cp, path+".criteria", path)
			case seenCrit[c]:
				l.errorAt("criteria", fmt.Sprintf("%s lists criterion %q twice", lbl, c), cp, path+".criteria", path)
			}
			seenCrit[c] = true
		}

		// Runner.
		if s.Runner != "" {
			if err := checkHostPort(s.Runner); err != "" {
				l.errorAt("runner", fmt.Sprintf("%s has runner %q, which is not host:port (e.g. localhost:7070): %s", lbl, s.Runner, err), path+".runner", path)
			}
		}

		l.judge(i, s)
		l.writer(i, s)
		l.routes(i, s)
	}
}

func (l *linter) judge(i int, s *Stage) {
	p, path, lbl := l.p, stagePath(i), label(s, i)
	if kindOf(s) != KindJudge {
		if s.Revise != "" {
			l.errorAt("judge-revise", fmt.Sprintf("%s has revise: %s, but only a judge sends work back: remove revise or make the stage kind: judge", lbl, s.Revise), path+".revise", path)
		}
		return
	}
	revisers := s.ReviseStages()
	if len(revisers) == 0 {
		l.errorAt("judge-revise", fmt.Sprintf("judge %q has no revise: name the earlier stage that gets the failures back when the verdict is FAIL (e.g. revise: draft)", s.Name), path+".revise", path)
		return
	}
	seen := map[string]bool{}
	for k, name := range revisers {
		at := path + ".revise"
		if len(s.Revisers) > 0 {
			at = fmt.Sprintf("%s.revise[%d]", path, k)
		}
		if seen[name] {
			l.errorAt("judge-revise", fmt.Sprintf("judge %q lists %q twice under revise", s.Name, name), at, path+".revise", path)
			continue
		}
		seen[name] = true
		r, j, ok := p.Stage(name)
		switch {
		case !ok:
			l.errorAt("judge-revise", fmt.Sprintf("judge %q revises %q, which is not a stage of this pipeline (stages: %s)", s.Name, name, strings.Join(stageNames(p), ", ")), at, path+".revise", path)
		case j >= i:
			l.errorAt("judge-revise", fmt.Sprintf("judge %q revises %q, which does not come before it: revise must name a stage that runs before the judge", s.Name, name), at, path+".revise", path)
		case kindOf(r) != KindAgent:
			l.errorAt("judge-revise", fmt.Sprintf("judge %q revises %q, a %s stage: only an agent stage can revise its work", s.Name, name, kindOf(r)), at, path+".revise", path)
		case s.Input != "" && r.Output.SchemaVersion != "" && versionType(r.Output.SchemaVersion) == r.Output.Type && s.Input != r.Output.SchemaVersion:
			l.errorAt("judge-revise", fmt.Sprintf("judge %q reads %s but sends FAILs back to %q, which outputs %s: a judge must read what the stage it revises produces", s.Name, s.Input, name, r.Output.SchemaVersion), path+".input", path)
		}
	}
}

func (l *linter) writer(i int, s *Stage) {
	p, path, lbl := l.p, stagePath(i), label(s, i)
	if kindOf(s) != KindWriteback {
		if s.Writer != nil {
			l.errorAt("writer", fmt.Sprintf("%s has a writer but is a%s %s stage: only kind: writeback stages write to external systems", lbl, article(kindOf(s)), kindOf(s)), path+".writer", path)
		}
		return
	}
	w := s.Writer
	switch {
	case w == nil:
		if !p.bad[path+".writer"] {
			l.errorAt("writer", fmt.Sprintf("writeback stage %q has no writer: add writer: {system: ..., target: ...} naming the external system it writes and the writeback service target", s.Name), path+".writer", path)
		}
	default:
		wp := path + ".writer"
		systems := catalogueSystems(p)
		switch {
		case w.System == "":
			l.errorAt("writer", fmt.Sprintf("writeback stage %q has no writer.system: name the external system it writes (e.g. crm)", s.Name), wp+".system", wp, path)
		case !slices.Contains(systems, w.System):
			l.errorAt("writer", fmt.Sprintf("writeback stage %q writes system %q, which no tool in the catalogue belongs to (systems: %s)", s.Name, w.System, orWord(strings.Join(systems, ", "), "none")), wp+".system", wp, path)
		}
		switch {
		case w.Target == "":
			l.errorAt("writer", fmt.Sprintf("writeback stage %q has no writer.target: name the writeback service target that performs the write (e.g. ledger)", s.Name), wp+".target", wp, path)
		case !stageNameRE.MatchString(w.Target) || len(w.Target) > maxNameLen:
			l.errorAt("writer", fmt.Sprintf("writeback stage %q has writer.target %q, which is not a valid target name: use lowercase letters, digits, '_' and '-', starting with a letter", s.Name, w.Target), wp+".target", wp, path)
		}
	}

	// The gate: a judge runs before, and nothing but judges and writebacks between the
	// last judge and this stage, so what is written is what the judge passed.
	judge := -1
	for j := i - 1; j >= 0; j-- {
		if p.Stages[j].Judges() {
			judge = j
			break
		}
	}
	if judge < 0 {
		l.errorAt("writeback-gate", fmt.Sprintf("writeback stage %q has no judge before it: writeback never runs without a judge's PASS, so add a kind: judge stage before it", s.Name), path+".kind", path)
		return
	}
	for k := judge + 1; k < i; k++ {
		if kindOf(&p.Stages[k]) == KindAgent && !l.ungated[k] {
			if l.ungated == nil {
				l.ungated = map[int]bool{}
			}
			l.ungated[k] = true
			l.errorAt("writeback-gate", fmt.Sprintf("%s runs after judge %q and before writeback stage %q%s: its output would be written without a judge's PASS; move it before the judge", label(&p.Stages[k], k), p.Stages[judge].Name, s.Name, l.lineOf(i)), stagePath(k))
			break
		}
	}
}

// writers checks one-writer and judge-no-write: one writeback stage per external system,
// and write tools only on the writer of their system.
func (l *linter) writers() {
	p := l.p
	writer := map[string]int{} // system -> stage index of its writeback stage
	for i := range p.Stages {
		s := &p.Stages[i]
		if kindOf(s) != KindWriteback || s.Writer == nil || s.Writer.System == "" {
			continue
		}
		if j, dup := writer[s.Writer.System]; dup {
			path := stagePath(i)
			l.errorAt("one-writer", fmt.Sprintf("stages %q%s and %q both write to system %s: exactly one writeback stage may write to an external system", p.Stages[j].Name, l.lineOf(j), s.Name, s.Writer.System), path+".writer.system", path+".writer", path)
			continue
		}
		writer[s.Writer.System] = i
	}
	for i := range p.Stages {
		s := &p.Stages[i]
		for j, name := range s.Tools {
			t, ok := p.Tool(name)
			if !ok || t.Access != AccessWrite {
				continue
			}
			tp := fmt.Sprintf("%s.tools[%d]", stagePath(i), j)
			if kindOf(s) == KindJudge {
				l.errorAt("judge-no-write", fmt.Sprintf("judge %q holds write tool %s (system %s): a judge holds no write tools; writes go through the writeback stage", s.Name, t.Name, t.System), tp, stagePath(i))
				continue
			}
			if kindOf(s) == KindWriteback && (s.Writer == nil || s.Writer.System == t.System || !slices.Contains(catalogueSystems(p), s.Writer.System)) {
				continue // the right writer, or a broken writer the writer rule reports
			}
			msg := fmt.Sprintf("%s holds write tool %s for system %s but is not the writer of %s: ", label(s, i), t.Name, t.System, t.System)
			if w, ok := writer[t.System]; ok {
				msg += fmt.Sprintf("only writeback stage %q%s writes to %s", p.Stages[w].Name, l.lineOf(w), t.System)
			} else {
				msg += fmt.Sprintf("writes to %s go through one kind: writeback stage with writer.system: %s", t.System, t.System)
			}
			l.errorAt("one-writer", msg, tp, stagePath(i))
		}
	}
}

// oneStage reports two stages that hold the same tools and the same criteria.
func (l *linter) oneStage() {
	p := l.p
	for j := 1; j < len(p.Stages); j++ {
		for i := 0; i < j; i++ {
			a, b := &p.Stages[i], &p.Stages[j]
			if !sameSet(a.Tools, b.Tools) || !sameSet(a.Criteria, b.Criteria) {
				continue
			}
			if (a.RejectedRole != "" && a.RejectedRole == b.Name) || (b.RejectedRole != "" && b.RejectedRole == a.Name) {
				continue // a fallback is the same stage served elsewhere, on purpose
			}
			l.errorAt("one-stage", fmt.Sprintf("stages %q%s and %q%s hold the same tools and criteria: they are one stage (merge them, or give each its own tools or criteria)", a.Name, l.lineOf(i), b.Name, l.lineOf(j)), stagePath(j))
			break
		}
	}
}

// versionType is the type part of a schema version ("chunks" of "chunks.v1").
func versionType(v string) string {
	if m := schemaVersionRE.FindStringSubmatch(v); m != nil {
		return m[1]
	}
	return ""
}

func sameSet(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(slices.Compact(x), slices.Compact(y))
}

func checkHostPort(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return strings.TrimPrefix(err.Error(), "address "+addr+": ")
	}
	if host == "" {
		return "the host is missing"
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("port %q is not a number from 1 to 65535", port)
	}
	return ""
}

func toolNames(ts []Tool) []string {
	var out []string
	for _, t := range ts {
		if t.Name != "" && !slices.Contains(out, t.Name) {
			out = append(out, t.Name)
		}
	}
	return out
}

func stageNames(p *Pipeline) []string {
	var out []string
	for _, s := range p.Stages {
		if s.Name != "" {
			out = append(out, s.Name)
		}
	}
	return out
}

func catalogueSystems(p *Pipeline) []string {
	var out []string
	for _, t := range p.Tools {
		if t.System != "" && !slices.Contains(out, t.System) {
			out = append(out, t.System)
		}
	}
	return out
}

func orWord(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func orExample(t string) string {
	if artifactTypeRE.MatchString(t) {
		return t
	}
	return "chunks"
}

func article(word string) string {
	if word != "" && strings.ContainsRune("aeiou", rune(word[0])) {
		return "n"
	}
	return ""
}

// pii checks the pii block: a known policy, patterns with unique, well-formed names and
// regexes that compile and match something.
func (l *linter) pii() {
	p := l.p
	switch p.PII.Policy {
	case "", PIIReject, PIIRedact:
	default:
		l.errorAt("pii", fmt.Sprintf("pii.policy is %q: use %s (refuse a job or stage result holding personal data, the default) or %s (keep the value in the coordinator's vault and pass a pii: ref)", p.PII.Policy, PIIReject, PIIRedact), "pii.policy", "pii")
	}
	first := map[string]int{}
	for i, pt := range p.PII.Patterns {
		path := fmt.Sprintf("pii.patterns[%d]", i)
		why := pii.CheckPattern(pt)
		if strings.HasPrefix(why, "name") {
			l.errorAt("pii", fmt.Sprintf("pii.patterns[%d]: %s", i, why), path+".name", path)
			continue
		}
		if j, dup := first[pt.Name]; dup {
			l.errorAt("pii", fmt.Sprintf("pii pattern name %q is used twice (first as pii.patterns[%d])", pt.Name, j), path+".name", path)
			continue
		}
		first[pt.Name] = i
		if why != "" {
			l.errorAt("pii", fmt.Sprintf("pii.patterns[%d] (%s): %s", i, pt.Name, why), path+".regex", path)
		}
	}
}
