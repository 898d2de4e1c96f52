package manifesttest

import (
	"bytes"
	"context"
	"debug/elf"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// binaries are the packages the Dockerfile builds, by output name.
var binaries = []string{"coordinator", "agentrunner", "writeback", "handoff"}

// goBuildFlags are the Dockerfile's `go build` flags (TestDockerfile holds it to them).
var goBuildFlags = []string{"-trimpath", "-ldflags=-s -w"}

// TestStaticBinaries builds the four binaries the way the Dockerfile does, in one `go
// build`, and checks that each is a static ELF executable: no program interpreter and no
// shared library, so it runs on distroless/static, which has no libc. Then it runs the
// manifests' own probe command against each service that serves mTLS.
func TestStaticBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skips building the binaries")
	}
	root := repoRoot(t)
	out := t.TempDir()
	args := append([]string{"build"}, goBuildFlags...)
	args = append(args, "-o", out+string(filepath.Separator))
	for _, b := range binaries {
		args = append(args, "./cmd/"+b)
	}
	goBuild(t, root, args...)
	for _, b := range binaries {
		checkStatic(t, filepath.Join(out, b))
	}
	if runtime.GOOS != "linux" {
		t.Skipf("built linux binaries; running them needs linux, not %s", runtime.GOOS)
	}
	// Each binary runs: --help exits 0.
	help := map[string]string{}
	for _, b := range binaries {
		flag := "-h"
		if b == "handoff" {
			flag = "help"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		o, err := exec.CommandContext(ctx, filepath.Join(out, b), flag).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", b, flag, err, o)
		}
		help[b] = string(o)
	}
	t.Run("probe", func(t *testing.T) { testProbes(t, root, out, help) })
	// Replicas of the coordinator split the runs by lease; without leases, two would drive
	// the same run (each resumes every RUNNING run it finds in the shared store).
	t.Run("coordinator-replicas-need-leases", func(t *testing.T) {
		leases := strings.Contains(help["coordinator"], "-lease-ttl")
		for _, o := range overlays {
			m := renderParsed(t, o)
			if d := m.deployments["coordinator"]; d != nil && d.Spec.Replicas != nil && *d.Spec.Replicas > 1 && !leases {
				t.Errorf("overlay %s runs %d coordinators, but the coordinator has no --lease-ttl: runs would be driven twice", o.name, *d.Spec.Replicas)
			}
		}
	})
}

// goBuild runs the go command in dir for linux with cgo off, as the Dockerfile's builder.
func goBuild(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	start := time.Now()
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, o)
	}
	t.Logf("go %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
}

// checkStatic fails unless path is an ELF executable with no PT_INTERP program header and
// no DT_NEEDED entry.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		t.Errorf("%s: ELF type %v, want an executable", path, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has a PT_INTERP program header: dynamically linked", path)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Errorf("%s: reading DT_NEEDED: %v", path, err)
	}
	if len(libs) > 0 {
		t.Errorf("%s: needs shared libraries %v", path, libs)
	}
}

// testProbes starts each service binary with the environment its rendered Deployment
// gives it (paths and ports moved onto this machine, bbolt in place of Redis), then runs
// that Deployment's readiness and liveness commands: they must pass. The checks the
// kubelet's own `grpc:` probe would make (plaintext; TLS without a client certificate)
// must fail, which is why the manifests exec grpc_health_probe.
func testProbes(t *testing.T, root, bin string, help map[string]string) {
	m := renderParsed(t, overlays[0])
	// grpc_health_probe, built as the Dockerfile builds it, at the version the module pins.
	goBuild(t, root, append(append([]string{"build", "-C", "deploy/k8s/manifesttest"}, goBuildFlags...),
		"-o", filepath.Join(bin, "grpc_health_probe"), "github.com/grpc-ecosystem/grpc-health-probe")...)
	probe := filepath.Join(bin, "grpc_health_probe")
	checkStatic(t, probe)

	work := t.TempDir()
	certs := filepath.Join(work, "certs")
	if o, err := exec.Command(filepath.Join(bin, "handoff"), "certs", "--dir", certs).CombinedOutput(); err != nil {
		t.Fatalf("handoff certs: %v\n%s", err, o)
	}
	pipelines := configMapDir(t, m, filepath.Join(work, "pipelines"))

	for _, s := range services {
		t.Run(s.name, func(t *testing.T) {
			if !strings.Contains(help[s.name], "-certs") {
				t.Skipf("%s has no --certs flag yet, so it cannot serve the mTLS the manifests give it; its probe is checked once it does", s.name)
			}
			c := deploymentContainer(m, s.name)
			if c == nil {
				t.Fatalf("no %s container", s.name)
			}
			dir := t.TempDir()
			grpcPort, metricsAddr := freePort(t), "127.0.0.1:"+strconv.Itoa(freePort(t))
			env := []string{}
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "HANDOFF_") {
					env = append(env, kv)
				}
			}
			for _, e := range c.Env {
				v := e.Value
				switch {
				case strings.HasSuffix(e.Name, "_LISTEN") && e.Name != "HANDOFF_METRICS_LISTEN":
					v = "127.0.0.1:" + strconv.Itoa(grpcPort)
				case e.Name == "HANDOFF_METRICS_LISTEN":
					v = metricsAddr
				case e.Name == "HANDOFF_STORE":
					v = filepath.Join(dir, s.name+".db") // the same flag also takes redis://
				case e.Name == "HANDOFF_CERTS":
					v = certs
				case e.Name == "HANDOFF_ARTIFACTS":
					v = filepath.Join(dir, "artifacts")
				case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
					v = "manifest-test-secret-" + e.ValueFrom.SecretKeyRef.Name // the Secret's value, made up here
				}
				env = append(env, e.Name+"="+v)
			}
			var args []string
			for _, a := range c.Args {
				args = append(args, strings.Replace(a, "/etc/handoff/pipelines", pipelines, 1))
			}
			var log bytes.Buffer
			cmd := exec.Command(filepath.Join(bin, s.name), args...)
			cmd.Env, cmd.Stdout, cmd.Stderr = env, &log, &log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})

			local := func(argv []string) []string {
				out := []string{probe}
				for _, a := range argv[1:] {
					a = strings.Replace(a, certsDir, certs, 1)
					if strings.HasPrefix(a, "-addr=") {
						a = "-addr=localhost:" + strconv.Itoa(grpcPort)
					}
					out = append(out, a)
				}
				return out
			}
			readiness := local(c.ReadinessProbe.Exec.Command)
			deadline := time.Now().Add(20 * time.Second)
			for {
				o, err := exec.Command(readiness[0], readiness[1:]...).CombinedOutput()
				if err == nil {
					break
				}
				select {
				case werr := <-exited:
					t.Fatalf("%s exited (%v) before its readiness probe passed:\n%s", s.name, werr, log.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("readiness probe %q still failing: %v\n%s\n%s log:\n%s", readiness, err, o, s.name, log.String())
				}
				time.Sleep(200 * time.Millisecond)
			}
			liveness := local(c.LivenessProbe.Exec.Command)
			if o, err := exec.Command(liveness[0], liveness[1:]...).CombinedOutput(); err != nil {
				t.Errorf("liveness probe %q: %v\n%s", liveness, err, o)
			}
			addr := "-addr=localhost:" + strconv.Itoa(grpcPort)
			for what, argv := range map[string][]string{
				"the kubelet's grpc: probe (plaintext)":  {addr},
				"the kubelet's grpc: mode TLS (no cert)": {addr, "-tls", "-tls-no-verify"},
			} {
				if err := exec.Command(probe, argv...).Run(); err == nil {
					t.Errorf("%s passed against the mTLS port; the exec probe would be unnecessary", what)
				}
			}
			if strings.Contains(help[s.name], "-metrics-listen") {
				resp, err := http.Get("http://" + metricsAddr + "/metrics")
				if err != nil {
					t.Errorf("metrics: %v", err)
				} else {
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("metrics: %s", resp.Status)
					}
				}
			}
		})
	}
}

// configMapDir lays the coordinator's pipelines ConfigMap out in dir the way the kubelet
// mounts one (files are symlinks through ..data into a timestamped folder), so the test
// also covers --pipelines reading a real ConfigMap mount.
func configMapDir(t *testing.T, m *manifests, dir string) string {
	t.Helper()
	var cm *corev1.ConfigMap
	for _, v := range m.deployments["coordinator"].Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			cm = m.configMaps[v.ConfigMap.Name]
		}
	}
	if cm == nil {
		t.Fatal("the coordinator mounts no ConfigMap")
	}
	ts := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(ts, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
