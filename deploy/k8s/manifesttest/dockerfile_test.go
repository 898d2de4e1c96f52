package manifesttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

// stage is one FROM ... AS name stage.
type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile reads the subset of Dockerfile syntax the repository's file uses.
func parseDockerfile(data string) []stage {
	var stages []stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		cmd, args = strings.ToUpper(cmd), strings.TrimSpace(args)
		if cmd == "FROM" {
			f := strings.Fields(args)
			s := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			return
		}
		if len(stages) > 0 {
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, instruction{cmd, args})
		}
	}
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if body, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// TestDockerfile holds the Dockerfile to what the manifests and TestStaticBinaries assume:
// the same go build, one distroless nonroot target per binary, the user the pods run as,
// the gRPC ports, and grpc_health_probe where the probes exec it.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(data))
	byName := map[string]stage{}
	for _, s := range stages {
		byName[s.name] = s
	}
	build, ok := byName["build"]
	if !ok || !strings.HasPrefix(build.from, "golang:1.26") {
		t.Fatalf("want a builder stage `FROM golang:1.26 AS build`, stages %+v", stages)
	}
	if !slices.Contains(build.all("ENV"), "CGO_ENABLED=0") {
		t.Error("builder: want ENV CGO_ENABLED=0")
	}
	runs := strings.Join(build.all("RUN"), "\n")
	wantBuild := "go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/coordinator ./cmd/agentrunner ./cmd/writeback ./cmd/handoff"
	if !strings.Contains(runs, wantBuild) {
		t.Errorf("builder: want one %q (TestStaticBinaries builds the same way)", wantBuild)
	}
	if !strings.Contains(runs, "go build -C deploy/k8s/manifesttest -trimpath -ldflags='-s -w' -o /out/grpc_health_probe github.com/grpc-ecosystem/grpc-health-probe") {
		t.Error("builder: want grpc_health_probe built from the version deploy/k8s/manifesttest/go.mod pins")
	}
	if got, want := strings.Join(goBuildFlags, " "), "-trimpath -ldflags=-s -w"; got != want {
		t.Errorf("goBuildFlags %q drifted from the Dockerfile's %q", got, want)
	}

	ports := map[string]int32{"handoff": 0}
	for _, s := range services {
		ports[s.name] = s.port
	}
	for _, name := range binaries {
		t.Run(name, func(t *testing.T) {
			s, ok := byName[name]
			if !ok {
				t.Fatalf("no `--target %s` stage", name)
			}
			if s.from != "gcr.io/distroless/static-debian12:nonroot" {
				t.Errorf("FROM %s, want gcr.io/distroless/static-debian12:nonroot", s.from)
			}
			uid := strconv.FormatInt(serviceUID, 10)
			if u := s.all("USER"); len(u) != 1 || u[0] != uid+":"+uid {
				t.Errorf("USER %v, want %s:%s (the pods' runAsUser)", u, uid, uid)
			}
			bin := "/usr/local/bin/" + name
			var entry []string
			if e := s.all("ENTRYPOINT"); len(e) != 1 || json.Unmarshal([]byte(e[0]), &entry) != nil || !slices.Equal(entry, []string{bin}) {
				t.Errorf("ENTRYPOINT %v, want [%q] (exec form: the image has no shell)", e, bin)
			}
			copies := s.all("COPY")
			if !slices.Contains(copies, "--from=build /out/"+name+" "+bin) {
				t.Errorf("COPY %v: want the binary at %s", copies, bin)
			}
			port := ports[name]
			if port == 0 {
				return
			}
			if e := s.all("EXPOSE"); len(e) != 1 || !slices.Contains(strings.Fields(e[0]), strconv.Itoa(int(port))) {
				t.Errorf("EXPOSE %v, want %d", e, port)
			}
			if !slices.Contains(copies, "--from=build /out/grpc_health_probe "+probeBinary) {
				t.Errorf("COPY %v: the probes exec %s", copies, probeBinary)
			}
			listen := "HANDOFF_" + strings.ToUpper(name) + "_LISTEN=:" + strconv.Itoa(int(port))
			if !slices.Contains(s.all("ENV"), listen) {
				t.Errorf("ENV %v: want %s", s.all("ENV"), listen)
			}
		})
	}
}
