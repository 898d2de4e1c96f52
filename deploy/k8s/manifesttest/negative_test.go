package manifesttest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const goodDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: writeback
  namespace: handoff-dev
spec:
  replicas: 1
  selector:
    matchLabels: {app.kubernetes.io/name: writeback}
  template:
    metadata:
      labels: {app.kubernetes.io/name: writeback}
    spec:
      containers:
        - name: writeback
          image: handoff/writeback:dev
          readinessProbe:
            grpc: {port: 50053}
`

// TestStrictDecodeBites proves the decoder refuses what kubectl apply might silently drop.
func TestStrictDecodeBites(t *testing.T) {
	if _, _, err := decode([]byte(goodDeployment)); err != nil {
		t.Fatalf("the well-formed Deployment does not decode: %v", err)
	}
	bad := []struct {
		name, doc, want string
	}{
		{"misspelled top-level field", strings.Replace(goodDeployment, "  replicas: 1", "  replica: 1", 1), `unknown field "replica"`},
		{"misspelled nested field", strings.Replace(goodDeployment, "      containers:", "      contianers:", 1), `unknown field "contianers"`},
		{"misspelled probe field", strings.Replace(goodDeployment, "grpc: {port: 50053}", "grpc: {prot: 50053}", 1), `unknown field "prot"`},
		{"wrong type", strings.Replace(goodDeployment, "replicas: 1", "replicas: one", 1), "replicas"},
		{"duplicate field", strings.Replace(goodDeployment, "  replicas: 1", "  replicas: 1\n  replicas: 2", 1), "replicas"},
		{"unexpected kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", `unexpected kind "Pod"`},
		{"known kind, other version", "apiVersion: autoscaling/v1\nkind: HorizontalPodAutoscaler\nmetadata: {name: x}\n", "unexpected kind"},
		{"no kind", "metadata: {name: x}\n", "unexpected kind"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decode([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decode = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// And through the whole-stream path the overlays take.
	stream := goodDeployment + "---\n" + strings.Replace(goodDeployment, "replicas: 1", "replicaz: 1", 1)
	if _, err := parse([]byte(stream), "handoff-dev"); err == nil || !strings.Contains(err.Error(), "document 2") {
		t.Fatalf("parse = %v, want document 2 refused", err)
	}
	if _, err := parse([]byte(goodDeployment), "handoff-prod"); err == nil || !strings.Contains(err.Error(), `namespace "handoff-dev"`) {
		t.Fatalf("parse = %v, want the wrong namespace refused", err)
	}
}

// TestChecksBite breaks a rendered overlay in the ways the checks exist for, and expects
// each break to be reported.
func TestChecksBite(t *testing.T) {
	fresh := func(t *testing.T) *manifests { return renderParsed(t, overlays[0]) }
	for _, fn := range []func(*manifests) problems{checkInventory, checkPods, checkWiring, checkNetworkPolicies} {
		if p := fn(fresh(t)); len(p) > 0 {
			t.Fatalf("the unbroken overlay already fails: %v", p)
		}
	}
	tcp := corev1.ProtocolTCP
	port := func(n int) []networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(int32(n))
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &v}}
	}
	writeback := metav1.LabelSelector{MatchLabels: map[string]string{nameLabel: "writeback"}}
	cases := []struct {
		name  string
		check func(*manifests) problems
		brk   func(*manifests)
		want  string
	}{
		{"a second policy lets every pod of the namespace reach writeback", checkNetworkPolicies, func(m *manifests) {
			m.netpols["oops"] = &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
				PodSelector: writeback, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}, Ports: port(50053)}},
			}}
		}, "writeback: ingress rule 2: port 50053 open to agentrunner pods"},
		{"a rule with no from opens writeback to all", checkNetworkPolicies, func(m *manifests) {
			m.netpols["oops"] = &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
				PodSelector: writeback, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: port(50053)}},
			}}
		}, "admits every source"},
		{"writeback from another namespace's coordinator", checkNetworkPolicies, func(m *manifests) {
			r := &m.netpols["writeback-ingress"].Spec.Ingress[0]
			r.From[0].NamespaceSelector = &metav1.LabelSelector{}
		}, "open to pods of other namespaces"},
		{"redis reachable from a stranger", checkNetworkPolicies, func(m *manifests) {
			m.netpols["redis-ingress"].Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
		}, "redis: ingress rule 1: port 6379 open to stranger pods"},
		{"metrics open to every namespace", checkNetworkPolicies, func(m *manifests) {
			m.netpols["metrics-ingress"].Spec.Ingress[0].From[0].NamespaceSelector = &metav1.LabelSelector{}
		}, "metrics open to peers beyond"},
		{"no default deny", checkNetworkPolicies, func(m *manifests) { delete(m.netpols, "default-deny-ingress") }, "no default-deny"},
		{"writable root file system", checkPods, func(m *manifests) {
			f := false
			m.deployments["writeback"].Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = &f
		}, "writeback: readOnlyRootFilesystem"},
		{"root user", checkPods, func(m *manifests) {
			root := int64(0)
			m.statefulSets["redis"].Spec.Template.Spec.Containers[0].SecurityContext.RunAsUser = &root
		}, "redis container redis: runAsUser"},
		{"no limits", checkPods, func(m *manifests) {
			m.deployments["agentrunner"].Spec.Template.Spec.Containers[0].Resources.Limits = nil
		}, "agentrunner: needs a cpu request and limit"},
		{"kubelet grpc probe on an mTLS port", checkPods, func(m *manifests) {
			c := &m.deployments["coordinator"].Spec.Template.Spec.Containers[0]
			c.ReadinessProbe.ProbeHandler = corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: 50051}}
		}, "cannot pass on an mTLS port"},
		{"probe with another service's key", checkPods, func(m *manifests) {
			c := &m.deployments["coordinator"].Spec.Template.Spec.Containers[0]
			c.LivenessProbe.Exec.Command[5] = "-tls-client-key=/etc/handoff/certs/writeback-key.pem"
		}, "-tls-client-key"},
		{"every key of the certs Secret mounted", checkPods, func(m *manifests) {
			for i, v := range m.deployments["writeback"].Spec.Template.Spec.Volumes {
				if v.Secret != nil {
					m.deployments["writeback"].Spec.Template.Spec.Volumes[i].Secret.Items = nil
				}
			}
		}, "projects every key"},
		{"store elsewhere", checkWiring, func(m *manifests) {
			c := &m.deployments["agentrunner"].Spec.Template.Spec.Containers[0]
			for i := range c.Env {
				if c.Env[i].Name == "HANDOFF_STORE" {
					c.Env[i].Value = "/tmp/agentrunner.db"
				}
			}
		}, "HANDOFF_STORE"},
		{"service selects nothing", checkWiring, func(m *manifests) {
			m.services["writeback"].Spec.Selector = map[string]string{nameLabel: "writebak"}
		}, "Service writeback: selector"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := fresh(t)
			tc.brk(m)
			if p := tc.check(m); !p.mentions(tc.want) {
				t.Fatalf("want a problem mentioning %q, got %q", tc.want, p)
			}
		})
	}
}
