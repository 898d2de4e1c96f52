package manifesttest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestOverlays renders each overlay and checks what every deployment of handoff must hold.
func TestOverlays(t *testing.T) {
	for _, o := range overlays {
		t.Run(o.name, func(t *testing.T) {
			m := renderParsed(t, o)
			t.Run("inventory", func(t *testing.T) { checkInventory(m).report(t) })
			t.Run("pods", func(t *testing.T) { checkPods(m).report(t) })
			t.Run("wiring", func(t *testing.T) { checkWiring(m).report(t) })
			t.Run("networkpolicy", func(t *testing.T) { checkNetworkPolicies(m).report(t) })
			t.Run("pipelines", func(t *testing.T) { checkPipelines(m, repoRoot(t)).report(t) })
			t.Run("scaling", func(t *testing.T) { checkScaling(m, o.scale).report(t) })
		})
	}
}

// checkInventory: the objects each overlay must have, and nothing stray.
func checkInventory(m *manifests) problems {
	var p problems
	want := func(kind string, have []string, names ...string) {
		for _, n := range names {
			if !slices.Contains(have, n) {
				p.add("%s %s is missing", kind, n)
			}
		}
	}
	svcNames := []string{"coordinator", "agentrunner", "writeback"}
	want("Deployment", sortedKeys(m.deployments), svcNames...)
	withRedis, statefulSets := svcNames, 0
	if m.ownRedis {
		withRedis, statefulSets = append(slices.Clone(svcNames), "redis"), 1
		want("StatefulSet", sortedKeys(m.statefulSets), "redis")
	} else if _, ok := m.services["redis"]; ok || len(m.serviceAccounts) > 3 || m.netpols["redis-ingress"] != nil {
		p.add("an overlay on an external store still has the base's Redis objects: services %v, service accounts %v",
			sortedKeys(m.services), sortedKeys(m.serviceAccounts))
	}
	want("Service", sortedKeys(m.services), withRedis...)
	want("ServiceAccount", sortedKeys(m.serviceAccounts), withRedis...)
	want("PodDisruptionBudget", sortedKeys(m.pdbs), svcNames...)
	want("HorizontalPodAutoscaler", sortedKeys(m.hpas), "agentrunner")
	want("PersistentVolumeClaim", sortedKeys(m.pvcs), artifactsClaim)
	want("Namespace", sortedKeys(m.namespaces), m.namespace)
	if len(m.deployments) != 3 || len(m.statefulSets) != statefulSets || len(m.namespaces) != 1 {
		p.add("want 3 Deployments, %d StatefulSet, 1 Namespace; have %v, %v, %v", statefulSets,
			sortedKeys(m.deployments), sortedKeys(m.statefulSets), sortedKeys(m.namespaces))
	}
	for _, sa := range m.serviceAccounts {
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			p.add("ServiceAccount %s: automountServiceAccountToken must be false", sa.Name)
		}
	}
	if ns := m.namespaces[m.namespace]; ns != nil && ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		p.add("Namespace %s: want Pod Security Admission enforce=restricted", m.namespace)
	}
	for _, obj := range m.all {
		if obj.GetLabels()["app.kubernetes.io/part-of"] != "handoff" {
			p.add("%T %s: common label app.kubernetes.io/part-of=handoff missing", obj, obj.GetName())
		}
	}
	return p
}

// checkPods: every container of every workload runs non-root on a read-only root file
// system with no privileges, has requests and limits, and is probed: the services by a
// gRPC health check that can pass over their mTLS port, Redis by an exec probe.
func checkPods(m *manifests) problems {
	var p problems
	for _, w := range m.workloads() {
		spec := &w.template.Spec
		where := w.kind + " " + w.name
		if spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken {
			p.add("%s: mounts a service account token", where)
		}
		if sa := m.serviceAccounts[spec.ServiceAccountName]; spec.ServiceAccountName == "" || sa == nil {
			p.add("%s: serviceAccountName %q names no ServiceAccount of the overlay", where, spec.ServiceAccountName)
		}
		if len(spec.InitContainers)+len(spec.Containers) == 0 {
			p.add("%s: no containers", where)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			cw := fmt.Sprintf("%s container %s", where, c.Name)
			checkSecurity(&p, cw, spec.SecurityContext, c.SecurityContext)
			checkResources(&p, cw, c.Resources)
			if c.ReadinessProbe == nil || c.LivenessProbe == nil {
				p.add("%s: needs a readiness and a liveness probe", cw)
				continue
			}
			if w.name == "redis" {
				if c.ReadinessProbe.Exec == nil || len(c.ReadinessProbe.Exec.Command) == 0 {
					p.add("%s: readiness must be an exec probe (redis-cli ping)", cw)
				}
				continue
			}
			svc, ok := serviceNamed(c.Name)
			if !ok {
				p.add("%s: not a handoff service container; no probe rule for it", cw)
				continue
			}
			for kind, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				checkHealthProbe(&p, cw+" "+kind+" probe", spec, &c, svc, pr)
			}
		}
	}
	return p
}

func serviceNamed(name string) (service, bool) {
	for _, s := range services {
		if s.name == name {
			return s, true
		}
	}
	return service{}, false
}

func checkSecurity(p *problems, where string, pod *corev1.PodSecurityContext, c *corev1.SecurityContext) {
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	if c == nil {
		c = &corev1.SecurityContext{}
	}
	nonRoot := c.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = pod.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		p.add("%s: runAsNonRoot must be true", where)
	}
	uid := c.RunAsUser
	if uid == nil {
		uid = pod.RunAsUser
	}
	if uid == nil || *uid == 0 {
		p.add("%s: runAsUser must be set and not 0 (the image's user is not trusted to be non-root)", where)
	}
	if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		p.add("%s: readOnlyRootFilesystem must be true", where)
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		p.add("%s: allowPrivilegeEscalation must be false", where)
	}
	if c.Privileged != nil && *c.Privileged {
		p.add("%s: privileged", where)
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") || len(c.Capabilities.Add) > 0 {
		p.add("%s: capabilities must drop ALL and add none", where)
	}
	sp := c.SeccompProfile
	if sp == nil {
		sp = pod.SeccompProfile
	}
	if sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add("%s: seccompProfile must be RuntimeDefault", where)
	}
}

func checkResources(p *problems, where string, r corev1.ResourceRequirements) {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := r.Requests[name]
		lim, okLim := r.Limits[name]
		if !okReq || !okLim || req.IsZero() || lim.IsZero() {
			p.add("%s: needs a %s request and limit", where, name)
			continue
		}
		if req.Cmp(lim) > 0 {
			p.add("%s: %s request %s above its limit %s", where, name, req.String(), lim.String())
		}
	}
}

// checkHealthProbe: a service's probe must call grpc.health.v1 on its gRPC port in a way
// that can pass. Over mTLS (HANDOFF_CERTS set) the kubelet's own `grpc:` probe cannot: it
// dials plaintext, or TLS without a client certificate, and the handshake fails. So under
// mTLS the probe must exec grpc_health_probe with this pod's own certificate.
func checkHealthProbe(p *problems, where string, spec *corev1.PodSpec, c *corev1.Container, svc service, pr *corev1.Probe) {
	grpcPort := containerPort(c, "grpc")
	if grpcPort != svc.port {
		p.add("%s: container port named grpc is %d, want %d", where, grpcPort, svc.port)
	}
	certs, mtls := envValue(c, "HANDOFF_CERTS")
	if !mtls {
		if pr.GRPC == nil || pr.GRPC.Port != grpcPort {
			p.add("%s: want a gRPC health probe on port %d", where, grpcPort)
		}
		return
	}
	if pr.GRPC != nil {
		p.add("%s: a `grpc:` probe cannot pass on an mTLS port (the kubelet presents no client certificate); exec %s instead", where, probeBinary)
		return
	}
	if pr.Exec == nil || len(pr.Exec.Command) == 0 || pr.Exec.Command[0] != probeBinary {
		p.add("%s: want an exec probe running %s", where, probeBinary)
		return
	}
	flags := probeFlags(pr.Exec.Command[1:])
	host, port, err := net.SplitHostPort(flags["-addr"])
	if err != nil || (host != "localhost" && host != "127.0.0.1") || port != strconv.Itoa(int(grpcPort)) {
		p.add("%s: -addr=%q, want localhost:%d", where, flags["-addr"], grpcPort)
	}
	if _, ok := flags["-tls"]; !ok {
		p.add("%s: -tls missing", where)
	}
	if _, ok := flags["-tls-no-verify"]; ok {
		p.add("%s: -tls-no-verify: the probe must verify the server against the CA", where)
	}
	files := map[string]string{"-tls-ca-cert": "ca.pem", "-tls-client-cert": svc.name + ".pem", "-tls-client-key": svc.name + "-key.pem"}
	for flag, file := range files {
		if want := filepath.Join(certs, file); flags[flag] != want {
			p.add("%s: %s=%q, want %q", where, flag, flags[flag], want)
		}
	}
	// The files must be there: the certs mount holds exactly the CA certificate and this
	// service's own pair (never another service's key, never the CA key).
	mountedItems, err := secretItems(spec, c, certs)
	if err != nil {
		p.add("%s: %v", where, err)
		return
	}
	want := slices.Sorted(slices.Values([]string{"ca.pem", svc.name + ".pem", svc.name + "-key.pem"}))
	if slices.Sort(mountedItems); !slices.Equal(mountedItems, want) {
		p.add("%s: %s holds %v, want exactly %v", where, certs, mountedItems, want)
	}
}

// probeFlags parses grpc_health_probe's -name=value and -name arguments.
func probeFlags(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		m[k] = v
	}
	return m
}

// secretItems returns the file names the handoff-certs Secret volume mounted read-only at
// dir projects (every item named; a volume without items would expose every key).
func secretItems(spec *corev1.PodSpec, c *corev1.Container, dir string) ([]string, error) {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		if !vm.ReadOnly {
			return nil, fmt.Errorf("certs mount %s is not readOnly", dir)
		}
		for _, v := range spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			if v.Secret == nil || v.Secret.SecretName != certsSecret {
				return nil, fmt.Errorf("certs volume %s is not the Secret %s", v.Name, certsSecret)
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				return nil, fmt.Errorf("certs volume %s: set a defaultMode that others cannot read (0440)", v.Name)
			}
			if len(v.Secret.Items) == 0 {
				return nil, fmt.Errorf("certs volume %s projects every key of %s; list the items this pod needs", v.Name, certsSecret)
			}
			var names []string
			for _, it := range v.Secret.Items {
				if it.Mode != nil && *it.Mode&0o007 != 0 {
					return nil, fmt.Errorf("certs item %s is readable by others", it.Key)
				}
				if it.Key != it.Path {
					return nil, fmt.Errorf("certs item %s mounted as %s; --certs expects the `handoff certs` file names", it.Key, it.Path)
				}
				names = append(names, it.Path)
			}
			return names, nil
		}
		return nil, fmt.Errorf("volume %s of mount %s is not defined", vm.Name, dir)
	}
	return nil, fmt.Errorf("HANDOFF_CERTS=%s, but nothing is mounted there", dir)
}

// checkWiring: the addresses, ports, selectors and volumes the objects name exist and agree.
func checkWiring(m *manifests) problems {
	var p problems
	for _, s := range services {
		d := m.deployments[s.name]
		if d == nil {
			continue // reported by inventory
		}
		where := "Deployment " + s.name
		tmplLabels := d.Spec.Template.Labels
		if d.Spec.Selector == nil || !selects(d.Spec.Selector, tmplLabels) || tmplLabels[nameLabel] != s.name {
			p.add("%s: selector must match its template, labelled %s=%s", where, nameLabel, s.name)
		}
		c := container(&d.Spec.Template.Spec, s.name)
		if c == nil {
			p.add("%s: no container named %s", where, s.name)
			continue
		}
		if c.Image == "" {
			p.add("%s: no image", where)
		}
		listenEnv := "HANDOFF_" + strings.ToUpper(s.name) + "_LISTEN"
		want := map[string]string{
			listenEnv:                ":" + strconv.Itoa(int(s.port)),
			"HANDOFF_STORE":          m.store,
			"HANDOFF_CERTS":          certsDir,
			"HANDOFF_METRICS_LISTEN": ":" + strconv.Itoa(int(metricsPort)),
		}
		for k, v := range want {
			if got, _ := envValue(c, k); got != v {
				p.add("%s: env %s=%q, want %q", where, k, got, v)
			}
		}
		if got := containerPort(c, "http-metrics"); got != metricsPort {
			p.add("%s: container port http-metrics is %d, want %d", where, got, metricsPort)
		}
		checkService(&p, m, s.name, tmplLabels, map[string]int32{"grpc": s.port, "http-metrics": metricsPort})
		if pdb := m.pdbs[s.name]; pdb != nil {
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector, tmplLabels) {
				p.add("PodDisruptionBudget %s: want minAvailable 1 over the %s pods", s.name, s.name)
			}
		}
		// The artifact folder is one volume shared by the runner and writeback.
		if s.name != "coordinator" {
			dir, _ := envValue(c, "HANDOFF_ARTIFACTS")
			if claim := mountedClaim(&d.Spec.Template.Spec, c, dir); claim != artifactsClaim {
				p.add("%s: HANDOFF_ARTIFACTS=%q must be a writable mount of PVC %s (mounted: %q)", where, dir, artifactsClaim, claim)
			}
		}
	}
	if c := deploymentContainer(m, "coordinator"); c != nil {
		for env, target := range map[string]string{"HANDOFF_AGENTRUNNER_ADDR": "agentrunner", "HANDOFF_WRITEBACK_ADDR": "writeback"} {
			addr, _ := envValue(c, env)
			host, port, err := net.SplitHostPort(addr)
			s, _ := serviceNamed(target)
			if err != nil || host != target || port != strconv.Itoa(int(s.port)) {
				p.add("coordinator: %s=%q, want %s:%d (the Service, whose name is in its certificate)", env, addr, target, s.port)
			}
		}
	}
	// The store URL names the Redis Service, headless over the StatefulSet.
	if r := m.statefulSets["redis"]; r != nil {
		if r.Spec.ServiceName != "redis" {
			p.add("StatefulSet redis: serviceName %q, want redis", r.Spec.ServiceName)
		}
		if svc := m.services["redis"]; svc != nil && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			p.add("Service redis: want headless (clusterIP: None)")
		}
		checkService(&p, m, "redis", r.Spec.Template.Labels, map[string]int32{"redis": redisPort})
		c := container(&r.Spec.Template.Spec, "redis")
		if c == nil {
			p.add("StatefulSet redis: no container named redis")
		} else {
			if !strings.HasPrefix(c.Image, "redis:7") {
				p.add("StatefulSet redis: image %q, want redis:7", c.Image)
			}
			if i := slices.Index(c.Args, "--appendonly"); i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != "yes" {
				p.add("StatefulSet redis: want --appendonly yes, args %v", c.Args)
			}
			if len(r.Spec.VolumeClaimTemplates) == 0 || !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
				return vm.Name == r.Spec.VolumeClaimTemplates[0].Name && vm.MountPath == "/data"
			}) {
				p.add("StatefulSet redis: /data must be a volumeClaimTemplate")
			}
		}
	}
	return p
}

func deploymentContainer(m *manifests, name string) *corev1.Container {
	if d := m.deployments[name]; d != nil {
		return container(&d.Spec.Template.Spec, name)
	}
	return nil
}

// checkService: the Service of a workload selects its pods and maps each named port.
func checkService(p *problems, m *manifests, name string, podLabels map[string]string, ports map[string]int32) {
	svc := m.services[name]
	if svc == nil {
		return // reported by inventory
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(podLabels)) {
		p.add("Service %s: selector %v does not select the %s pods", name, svc.Spec.Selector, name)
	}
	for portName, port := range ports {
		if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
			return sp.Name == portName && sp.Port == port && sp.TargetPort.String() == portName
		}) {
			p.add("Service %s: want port %s %d targeting the container port %s", name, portName, port, portName)
		}
	}
}

// mountedClaim returns the PVC mounted writable at dir, or "".
func mountedClaim(spec *corev1.PodSpec, c *corev1.Container, dir string) string {
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir || vm.ReadOnly || dir == "" {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.PersistentVolumeClaim != nil {
				return v.PersistentVolumeClaim.ClaimName
			}
		}
	}
	return ""
}

// checkPipelines: the coordinator loads its pipelines from a ConfigMap that holds exactly
// the repository's pipelines/*.yaml, byte for byte.
func checkPipelines(m *manifests, root string) problems {
	var p problems
	d := m.deployments["coordinator"]
	c := deploymentContainer(m, "coordinator")
	if c == nil {
		return p
	}
	dir := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--pipelines="); ok {
			dir = v
		}
	}
	if dir == "" {
		p.add("coordinator: no --pipelines=DIR argument")
		return p
	}
	var cm *corev1.ConfigMap
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cm = m.configMaps[v.ConfigMap.Name]
				if cm == nil {
					p.add("coordinator: volume %s names ConfigMap %s, which the overlay lacks", v.Name, v.ConfigMap.Name)
					return p
				}
			}
		}
	}
	if cm == nil {
		p.add("coordinator: no ConfigMap mounted at --pipelines=%s", dir)
		return p
	}
	files, err := filepath.Glob(filepath.Join(root, "pipelines", "*.yaml"))
	if err != nil || len(files) == 0 {
		p.add("no pipelines/*.yaml in the repository (%v)", err)
		return p
	}
	var names []string
	for _, f := range files {
		name := filepath.Base(f)
		names = append(names, name)
		want, err := os.ReadFile(f)
		if err != nil {
			p.add("%v", err)
			continue
		}
		got, ok := cm.Data[name]
		if !ok {
			p.add("ConfigMap %s: no key %s; add pipelines/%s to the base's configMapGenerator", cm.Name, name, name)
		} else if !bytes.Equal([]byte(got), want) {
			p.add("ConfigMap %s: %s differs from pipelines/%s", cm.Name, name, name)
		}
	}
	for k := range cm.Data {
		if !slices.Contains(names, k) {
			p.add("ConfigMap %s: key %s is not a file in pipelines/", cm.Name, k)
		}
	}
	if len(cm.BinaryData) > 0 {
		p.add("ConfigMap %s: unexpected binaryData", cm.Name)
	}
	return p
}

// checkScaling: replica counts and the runner's autoscaler. (More than one coordinator
// needs run leases: TestStaticBinaries checks the coordinator binary has them.)
func checkScaling(m *manifests, overlayName string) problems {
	var p problems
	replicas := func(name string) int32 {
		if d := m.deployments[name]; d != nil && d.Spec.Replicas != nil {
			return *d.Spec.Replicas
		}
		return 1 // Kubernetes' default, or the HPA's minimum
	}
	hpa := m.hpas["agentrunner"]
	if hpa != nil {
		ref := hpa.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != "agentrunner" {
			p.add("HPA agentrunner: scaleTargetRef %+v, want apps/v1 Deployment agentrunner", ref)
		}
		if !cpuTarget(hpa.Spec.Metrics, 70) {
			p.add("HPA agentrunner: want one metric, CPU at 70%% average utilization")
		}
		if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 1 || hpa.Spec.MaxReplicas < *hpa.Spec.MinReplicas {
			p.add("HPA agentrunner: bad bounds")
		}
		if d := m.deployments["agentrunner"]; d != nil && d.Spec.Replicas != nil {
			p.add("Deployment agentrunner: replicas is set (%d); the HPA owns it, and an apply would undo its scaling", *d.Spec.Replicas)
		}
	}
	switch overlayName {
	case "dev":
		for _, n := range sortedKeys(m.deployments) {
			if n != "agentrunner" && replicas(n) != 1 {
				p.add("dev: Deployment %s has %d replicas, want 1", n, replicas(n))
			}
		}
		if hpa != nil && *hpa.Spec.MinReplicas != 1 {
			p.add("dev: HPA minReplicas %d, want 1", *hpa.Spec.MinReplicas)
		}
	case "prod":
		for _, n := range []string{"coordinator", "writeback"} {
			if replicas(n) < 2 {
				p.add("prod: %s has %d replicas, want at least 2", n, replicas(n))
			}
		}
		if hpa != nil && (*hpa.Spec.MinReplicas < 2 || hpa.Spec.MaxReplicas <= *hpa.Spec.MinReplicas) {
			p.add("prod: HPA agentrunner %d..%d, want a minimum of at least 2 and room above it", *hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
		}
		if pvc := m.pvcs[artifactsClaim]; pvc != nil && !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
			p.add("prod: PVC %s must be ReadWriteMany: runner and writeback pods on several nodes share it", artifactsClaim)
		}
	}
	return p
}

func cpuTarget(ms []autoscalingv2.MetricSpec, pct int32) bool {
	if len(ms) != 1 {
		return false
	}
	r := ms[0].Resource
	return ms[0].Type == autoscalingv2.ResourceMetricSourceType && r != nil && r.Name == corev1.ResourceCPU &&
		r.Target.Type == autoscalingv2.UtilizationMetricType && r.Target.AverageUtilization != nil && *r.Target.AverageUtilization == pct
}

// TestProdOutgrowsDev: prod's limits are at least dev's, and larger somewhere.
func TestProdOutgrowsDev(t *testing.T) {
	dev, prod := renderParsed(t, overlays[0]), renderParsed(t, overlays[1])
	larger := false
	for _, w := range prod.workloads() {
		for _, pc := range w.template.Spec.Containers {
			var dc *corev1.Container
			for _, dw := range dev.workloads() {
				if dw.name == w.name {
					dc = container(&dw.template.Spec, pc.Name)
				}
			}
			if dc == nil {
				t.Errorf("%s container %s is in prod only", w.name, pc.Name)
				continue
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				pl, dl := pc.Resources.Limits[r], dc.Resources.Limits[r]
				switch pl.Cmp(dl) {
				case -1:
					t.Errorf("%s: prod %s limit %s is below dev's %s", w.name, r, pl.String(), dl.String())
				case 1:
					larger = true
				}
			}
		}
	}
	if !larger {
		t.Error("prod's limits are nowhere larger than dev's")
	}
}

// selects reports whether a label selector matches a label set.
func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(set))
}

// ingressFor returns the ingress rules that apply to a pod with these labels (in the
// overlay's namespace), and whether any policy isolates it for ingress at all.
func ingressFor(m *manifests, podLabels map[string]string) (rules []networkingv1.NetworkPolicyIngressRule, isolated bool) {
	for _, n := range sortedKeys(m.netpols) {
		np := m.netpols[n]
		if !selects(&np.Spec.PodSelector, podLabels) {
			continue
		}
		ingressType := slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || len(np.Spec.PolicyTypes) == 0
		if !ingressType {
			continue
		}
		isolated = true
		rules = append(rules, np.Spec.Ingress...)
	}
	return rules, isolated
}

// checkNetworkPolicies: default deny; then, for each workload, every ingress rule that any
// policy opens to its pods is one of the rules it may have:
//
//	coordinator  gRPC 50051 from any pod of the namespace; metrics from monitoring
//	agentrunner  gRPC 50052 from coordinator pods only; metrics from monitoring
//	writeback    gRPC 50053 from coordinator pods only; metrics from monitoring
//	redis        6379 from coordinator, agentrunner and writeback pods only; nothing else
//
// Policies add up, so one broad rule anywhere would open a pod: each rule is judged alone.
func checkNetworkPolicies(m *manifests) problems {
	var p problems
	hasDefaultDeny := false
	for _, np := range m.netpols {
		if len(np.Spec.PodSelector.MatchLabels) == 0 && len(np.Spec.PodSelector.MatchExpressions) == 0 &&
			slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && len(np.Spec.Ingress) == 0 {
			hasDefaultDeny = true
		}
	}
	if !hasDefaultDeny {
		p.add("no default-deny ingress policy (podSelector: {}, policyTypes: [Ingress], no rules)")
	}

	// The pods a peer selector is tried against: every workload, plus strangers that are
	// in the namespace but are none of them.
	pods := map[string]map[string]string{}
	for _, w := range m.workloads() {
		pods[w.name] = w.template.Labels
	}
	pods["stranger"] = map[string]string{nameLabel: "stranger", "app.kubernetes.io/part-of": "handoff"}
	pods["unlabelled"] = map[string]string{}

	type allow struct {
		port  int32
		from  []string // pods (of the set above) allowed; nil: any pod of the namespace
		reach []string // pods that must be allowed
	}
	metrics := allow{port: metricsPort}
	rulesFor := map[string][]allow{
		"coordinator": {{port: 50051, reach: []string{"stranger", "agentrunner"}}, metrics},
		"agentrunner": {{port: 50052, from: []string{"coordinator"}, reach: []string{"coordinator"}}, metrics},
		"writeback":   {{port: 50053, from: []string{"coordinator"}, reach: []string{"coordinator"}}, metrics},
		"redis":       {{port: redisPort, from: []string{"coordinator", "agentrunner", "writeback"}, reach: []string{"coordinator", "agentrunner", "writeback"}}},
	}
	for _, target := range sortedKeys(rulesFor) {
		podLabels, ok := pods[target]
		if !ok {
			continue // reported by inventory
		}
		rules, isolated := ingressFor(m, podLabels)
		if !isolated {
			p.add("%s: no policy isolates its pods for ingress", target)
			continue
		}
		reached := map[int32][]string{}
		for i, r := range rules {
			where := fmt.Sprintf("%s: ingress rule %d", target, i+1)
			if len(r.Ports) == 0 {
				p.add("%s: opens every port", where)
				continue
			}
			if len(r.From) == 0 {
				p.add("%s: admits every source", where)
				continue
			}
			for _, rp := range r.Ports {
				if rp.Port == nil || rp.Port.IntValue() == 0 || rp.EndPort != nil || (rp.Protocol != nil && *rp.Protocol != corev1.ProtocolTCP) {
					p.add("%s: port %v: want one numbered TCP port", where, rp.Port)
					continue
				}
				port := int32(rp.Port.IntValue())
				idx := slices.IndexFunc(rulesFor[target], func(a allow) bool { return a.port == port })
				if idx < 0 {
					p.add("%s: opens port %d, which is not one of its own", where, port)
					continue
				}
				a := rulesFor[target][idx]
				for _, peer := range r.From {
					if peer.IPBlock != nil {
						p.add("%s: port %d open to an ipBlock", where, port)
						continue
					}
					if port == metricsPort {
						if peer.NamespaceSelector == nil || !selects(peer.NamespaceSelector, map[string]string{monitoringLabel: "true"}) ||
							selects(peer.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": "default"}) {
							p.add("%s: metrics open to peers beyond namespaces labelled %s=true", where, monitoringLabel)
						}
						continue
					}
					if peer.NamespaceSelector != nil || peer.PodSelector == nil {
						p.add("%s: port %d open to pods of other namespaces", where, port)
						continue
					}
					for _, name := range sortedKeys(pods) {
						if !selects(peer.PodSelector, pods[name]) {
							continue
						}
						if a.from != nil && !slices.Contains(a.from, name) {
							p.add("%s: port %d open to %s pods; only %v may connect", where, port, name, a.from)
						}
						reached[port] = append(reached[port], name)
					}
				}
			}
		}
		for _, a := range rulesFor[target] {
			for _, must := range a.reach {
				if !slices.Contains(reached[a.port], must) {
					p.add("%s: %s pods cannot reach port %d", target, must, a.port)
				}
			}
		}
	}
	return p
}
