package manifesttest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// rootModule is the module path of the repository root this module lives in.
const rootModule = "github.com/handoffhq/handoff"

// What the manifests and the Dockerfile agree on.
const (
	certsDir        = "/etc/handoff/certs"
	certsSecret     = "handoff-certs"
	probeBinary     = "/usr/local/bin/grpc_health_probe"
	metricsPort     = int32(9464)
	redisPort       = int32(6379)
	storeURL        = "redis://redis:6379"
	clusterStoreURL = "redis-cluster://redis-cluster-0.redis.example.internal:6379,redis-cluster-1.redis.example.internal:6379,redis-cluster-2.redis.example.internal:6379?wait=1"
	serviceUID      = int64(65532)
	nameLabel       = "app.kubernetes.io/name"
	monitoringLabel = "handoff.io/monitoring"
	artifactsClaim  = "handoff-artifacts"
)

// service is one of the three gRPC services.
type service struct {
	name string
	port int32
}

var services = []service{{"coordinator", 50051}, {"agentrunner", 50052}, {"writeback", 50053}}

// overlay is a kustomize overlay under deploy/k8s/overlays.
type overlay struct {
	name, namespace string
	// scale is the scaling rules the overlay follows (checkScaling): "dev" or "prod".
	scale string
	// store is every service's HANDOFF_STORE; ownRedis, whether the overlay runs the
	// base's Redis StatefulSet for it (prod-redis-cluster uses an external cluster).
	store    string
	ownRedis bool
}

var overlays = []overlay{
	{"dev", "handoff-dev", "dev", storeURL, true},
	{"prod", "handoff-prod", "prod", storeURL, true},
	{"prod-redis-cluster", "handoff-prod", "prod", clusterStoreURL, false},
}

// repoRoot walks up from the working directory to the go.mod that declares rootModule.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(data) == rootModule {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod declaring module %s above the working directory", rootModule)
		}
		dir = parent
	}
}

// modulePath returns the path on a go.mod file's module line.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "module"); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			if i := strings.Index(rest, "//"); i >= 0 {
				rest = rest[:i]
			}
			return strings.Trim(strings.TrimSpace(rest), `"`+"`")
		}
	}
	return ""
}

// kubectl returns kubectl's path. Without it the test skips, or fails when CI is set.
func kubectl(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("kubectl is not on PATH, and CI is set: the overlays cannot be rendered (%v)", err)
		}
		t.Skipf("kubectl is not on PATH (%v); CI=1 makes this a failure", err)
	}
	return p
}

// renderArgs is how every overlay is rendered: plain `kubectl kustomize`, as `kubectl apply
// -k` does, with the default load restrictor (the pipelines ConfigMap's files are in the
// base, deploy/k8s/README.md).
var renderArgs = []string{"kustomize"}

var rendered sync.Map // overlay name -> []byte

// render runs kubectl kustomize on an overlay, once per test binary. It needs no cluster
// and no network.
func render(t testing.TB, name string) []byte {
	t.Helper()
	kc := kubectl(t)
	if out, ok := rendered.Load(name); ok {
		return out.([]byte)
	}
	dir := filepath.Join(repoRoot(t), "deploy", "k8s", "overlays", name)
	cmd := exec.Command(kc, append(renderArgs, dir)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s %s: %v\n%s", strings.Join(renderArgs, " "), dir, err, stderr.String())
	}
	rendered.Store(name, out)
	return out
}

// kindKey names a type by apiVersion and kind.
type kindKey struct{ apiVersion, kind string }

// knownKinds are the only kinds the overlays may contain, each with its typed struct.
var knownKinds = map[kindKey]func() metav1.Object{
	{"apps/v1", "Deployment"}:                     func() metav1.Object { return &appsv1.Deployment{} },
	{"apps/v1", "StatefulSet"}:                    func() metav1.Object { return &appsv1.StatefulSet{} },
	{"v1", "Service"}:                             func() metav1.Object { return &corev1.Service{} },
	{"v1", "ServiceAccount"}:                      func() metav1.Object { return &corev1.ServiceAccount{} },
	{"v1", "ConfigMap"}:                           func() metav1.Object { return &corev1.ConfigMap{} },
	{"v1", "PersistentVolumeClaim"}:               func() metav1.Object { return &corev1.PersistentVolumeClaim{} },
	{"v1", "Namespace"}:                           func() metav1.Object { return &corev1.Namespace{} },
	{"policy/v1", "PodDisruptionBudget"}:          func() metav1.Object { return &policyv1.PodDisruptionBudget{} },
	{"autoscaling/v2", "HorizontalPodAutoscaler"}: func() metav1.Object { return &autoscalingv2.HorizontalPodAutoscaler{} },
	{"networking.k8s.io/v1", "NetworkPolicy"}:     func() metav1.Object { return &networkingv1.NetworkPolicy{} },
}

// decode decodes one YAML document strictly into the typed struct of its kind: an unknown
// or duplicated field, a wrong type, or a kind not in knownKinds is an error.
func decode(doc []byte) (metav1.Object, kindKey, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, kindKey{}, fmt.Errorf("reading apiVersion and kind: %w", err)
	}
	k := kindKey{tm.APIVersion, tm.Kind}
	newObj, ok := knownKinds[k]
	if !ok {
		return nil, k, fmt.Errorf("unexpected kind %q (apiVersion %q): not one the deployment is made of", tm.Kind, tm.APIVersion)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, k, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if obj.GetName() == "" {
		return nil, k, fmt.Errorf("%s without metadata.name", tm.Kind)
	}
	return obj, k, nil
}

// splitDocs splits a YAML stream into its non-empty documents.
func splitDocs(stream []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			docs = append(docs, doc)
		}
	}
}

// manifests is a rendered overlay, by kind and name.
type manifests struct {
	namespace       string
	store           string // the HANDOFF_STORE every service must have
	ownRedis        bool   // a redis StatefulSet is part of the overlay
	deployments     map[string]*appsv1.Deployment
	statefulSets    map[string]*appsv1.StatefulSet
	services        map[string]*corev1.Service
	serviceAccounts map[string]*corev1.ServiceAccount
	configMaps      map[string]*corev1.ConfigMap
	pvcs            map[string]*corev1.PersistentVolumeClaim
	namespaces      map[string]*corev1.Namespace
	pdbs            map[string]*policyv1.PodDisruptionBudget
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	netpols         map[string]*networkingv1.NetworkPolicy
	all             []metav1.Object
}

// parse decodes every document of a rendered overlay. Every namespaced object must be in
// namespace; a name used twice for one kind is an error.
func parse(stream []byte, namespace string) (*manifests, error) {
	docs, err := splitDocs(stream)
	if err != nil {
		return nil, err
	}
	m := &manifests{
		namespace:   namespace,
		deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{},
		services: map[string]*corev1.Service{}, serviceAccounts: map[string]*corev1.ServiceAccount{},
		configMaps: map[string]*corev1.ConfigMap{}, pvcs: map[string]*corev1.PersistentVolumeClaim{},
		namespaces: map[string]*corev1.Namespace{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		hpas: map[string]*autoscalingv2.HorizontalPodAutoscaler{}, netpols: map[string]*networkingv1.NetworkPolicy{},
	}
	var errs []error
	for i, doc := range docs {
		obj, k, err := decode(doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i+1, err))
			continue
		}
		if k.kind != "Namespace" && obj.GetNamespace() != namespace {
			errs = append(errs, fmt.Errorf("%s %s: namespace %q, want %q", k.kind, obj.GetName(), obj.GetNamespace(), namespace))
		}
		dup := false
		switch o := obj.(type) {
		case *appsv1.Deployment:
			dup = put(m.deployments, o)
		case *appsv1.StatefulSet:
			dup = put(m.statefulSets, o)
		case *corev1.Service:
			dup = put(m.services, o)
		case *corev1.ServiceAccount:
			dup = put(m.serviceAccounts, o)
		case *corev1.ConfigMap:
			dup = put(m.configMaps, o)
		case *corev1.PersistentVolumeClaim:
			dup = put(m.pvcs, o)
		case *corev1.Namespace:
			dup = put(m.namespaces, o)
		case *policyv1.PodDisruptionBudget:
			dup = put(m.pdbs, o)
		case *autoscalingv2.HorizontalPodAutoscaler:
			dup = put(m.hpas, o)
		case *networkingv1.NetworkPolicy:
			dup = put(m.netpols, o)
		}
		if dup {
			errs = append(errs, fmt.Errorf("%s %s appears twice", k.kind, obj.GetName()))
		}
		m.all = append(m.all, obj)
	}
	return m, errors.Join(errs...)
}

func put[T metav1.Object](m map[string]T, o T) (dup bool) {
	_, dup = m[o.GetName()]
	m[o.GetName()] = o
	return dup
}

// renderParsed renders and decodes an overlay, failing the test on any error.
func renderParsed(t testing.TB, o overlay) *manifests {
	t.Helper()
	m, err := parse(render(t, o.name), o.namespace)
	if err != nil {
		t.Fatalf("overlay %s: %v", o.name, err)
	}
	m.store, m.ownRedis = o.store, o.ownRedis
	return m
}

// workload is a Deployment's or StatefulSet's pod template.
type workload struct {
	kind, name string
	template   *corev1.PodTemplateSpec
}

func (m *manifests) workloads() []workload {
	var ws []workload
	for _, n := range sortedKeys(m.deployments) {
		ws = append(ws, workload{"Deployment", n, &m.deployments[n].Spec.Template})
	}
	for _, n := range sortedKeys(m.statefulSets) {
		ws = append(ws, workload{"StatefulSet", n, &m.statefulSets[n].Spec.Template})
	}
	return ws
}

func sortedKeys[T any](m map[string]T) []string { return slices.Sorted(maps.Keys(m)) }

// container returns the container of a pod spec by name, or nil.
func container(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

// envValue returns a container's literal environment value and whether it is set.
func envValue(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// containerPort returns the number of a container's named port, or 0.
func containerPort(c *corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

// problems collects failed checks, so a check function can be run on broken input by the
// negative tests as well as on the real overlays.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) report(t testing.TB) {
	t.Helper()
	for _, s := range p {
		t.Error(s)
	}
}

func (p problems) mentions(sub string) bool {
	for _, s := range p {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
