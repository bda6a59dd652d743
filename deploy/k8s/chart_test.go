package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-rl/tollgate/deploy"
	"github.com/tollgate-rl/tollgate/filter/plugin"
)

const (
	chartDir  = "../helm/tollgate"
	release   = "tollgate"
	namespace = "tollgate"
)

// rendered is one render of the chart, each object decoded into its API type.
type rendered struct {
	deployment      *appsv1.Deployment
	services        map[string]*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	pdb             *policyv1.PodDisruptionBudget
	hpa             *autoscalingv2.HorizontalPodAutoscaler
	netpol          *networkingv1.NetworkPolicy
	serviceMonitor  *serviceMonitor
	istio           *deploy.Istio // nil when the chart rendered no Istio object
}

// serviceMonitor is the part of prometheus-operator's monitoring.coreos.com/v1
// ServiceMonitor the chart writes (that module is not available to this build),
// decoded strictly like the rest: a field the chart adds must be added here.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the chart as `helm install tollgate -n tollgate` would with vals (YAML).
func render(t *testing.T, c *chart.Chart, vals string) (map[string]string, error) {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(vals))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}
	if !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, caps.KubeVersion.String()) {
		t.Fatalf("chart kubeVersion %q excludes %s", c.Metadata.KubeVersion, caps.KubeVersion)
	}
	rv, err := chartutil.ToRenderValues(c, v, chartutil.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(c, rv)
}

// decode splits the rendered files into objects and reads each strictly.
func decode(t *testing.T, files map[string]string) *rendered {
	t.Helper()
	r := &rendered{services: map[string]*corev1.Service{}}
	var istioDocs []string
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files[name], -1) {
			js, err := yaml.YAMLToJSONStrict([]byte(doc))
			if err != nil {
				t.Fatalf("%s document %d: %v", name, i, err)
			}
			if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
				continue
			}
			var tm struct{ APIVersion, Kind string }
			if err := json.Unmarshal(js, &tm); err != nil {
				t.Fatalf("%s document %d: %v", name, i, err)
			}
			where := fmt.Sprintf("%s document %d (%s %s)", name, i, tm.APIVersion, tm.Kind)
			strict := func(into any) {
				t.Helper()
				dec := json.NewDecoder(bytes.NewReader(js))
				dec.DisallowUnknownFields()
				if err := dec.Decode(into); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
			}
			switch tm.APIVersion + "/" + tm.Kind {
			case "apps/v1/Deployment":
				if r.deployment != nil {
					t.Fatalf("%s: a second Deployment", where)
				}
				r.deployment = &appsv1.Deployment{}
				strict(r.deployment)
			case "v1/Service":
				s := &corev1.Service{}
				strict(s)
				r.services[s.Name] = s
			case "v1/ServiceAccount":
				sa := &corev1.ServiceAccount{}
				strict(sa)
				r.serviceAccounts = append(r.serviceAccounts, sa)
			case "policy/v1/PodDisruptionBudget":
				r.pdb = &policyv1.PodDisruptionBudget{}
				strict(r.pdb)
			case "autoscaling/v2/HorizontalPodAutoscaler":
				r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
				strict(r.hpa)
			case "networking.k8s.io/v1/NetworkPolicy":
				r.netpol = &networkingv1.NetworkPolicy{}
				strict(r.netpol)
			case "monitoring.coreos.com/v1/ServiceMonitor":
				r.serviceMonitor = &serviceMonitor{}
				strict(r.serviceMonitor)
			case "v1/Secret", "v1/ConfigMap":
				t.Fatalf("%s: the chart must reference existing Secrets, never carry values", where)
			default:
				if strings.Contains(tm.APIVersion, "istio.io/") {
					istioDocs = append(istioDocs, doc)
					continue
				}
				t.Fatalf("%s: a kind this test does not check", where)
			}
		}
	}
	if len(istioDocs) > 0 {
		is, err := deploy.CheckIstio([]byte(strings.Join(istioDocs, "\n---\n")))
		if err != nil {
			t.Fatalf("Istio objects: %v", err)
		}
		r.istio = is
	}
	return r
}

// serviceFlags are the flags the service binary accepts, read from its --help.
var serviceFlags = sync.OnceValues(func() (map[string]bool, error) {
	dir, err := os.MkdirTemp("", "tollgate-chart-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "tollgate-ratelimit")
	build := exec.Command("go", "build", "-o", bin, "./ratelimit/cmd/tollgate-ratelimit")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %v: %s", err, out)
	}
	out, err := exec.Command(bin, "--help").Output()
	if err != nil {
		return nil, err
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z0-9-]+) \[`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	return flags, nil
})

// valueSets are the deployments the chart is rendered for: each must decode strictly
// and pass every check below.
var valueSets = []struct {
	name, values string
	redisMode    string
	istio        bool
}{
	{name: "defaults", redisMode: "standalone"},
	{name: "cluster", redisMode: "cluster", values: `
redis:
  mode: cluster
  addrs: [redis-0.redis:6379, redis-1.redis:6379, redis-2.redis:6379]
  username: tollgate
  password: {secretName: redis-acl, key: password}
secrets:
  keyHash: {secretName: tollgate-key-hash}
policyStore:
  url: postgres://tollgate@pg-rw.db.svc:5432/tollgate?sslmode=verify-full
  passfile: {secretName: pg-app}
autoscaling: {enabled: false}
replicaCount: 3
serviceMonitor: {enabled: true, labels: {release: prometheus}}
`},
	{name: "sentinel-tls", redisMode: "sentinel", values: `
redis:
  mode: sentinel
  masterName: mymaster
  addrs: [sentinel-0.redis:26379, sentinel-1.redis:26379, sentinel-2.redis:26379]
  username: tollgate
  password: {secretName: redis-acl, key: password}
  tls:
    enabled: true
    serverName: redis.internal
    caSecret: {secretName: redis-ca, key: ca.crt}
    clientCertSecret: {secretName: tollgate-redis-client}
image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
`},
	{name: "istio", redisMode: "standalone", istio: true, values: `
istio:
  enabled: true
  wasmPlugin:
    sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    pluginConfig:
      version: 1
      sync: {interval_ms: 200, expected_nodes: 4}
      key: {source: header, name: x-api-key, fallback: {source: ip}}
      rules:
      - {id: plan, match: {prefix: /}, limit: 100, window: 1m}
      - {id: login, match: {prefix: /login, methods: [POST]}, key: {source: ip}, limit: 5, window: 1m, strict: true}
  serviceEntry: {enabled: true}
`},
}

// TestChartRenders renders the chart for each value set and checks what a cluster
// would otherwise only reveal at rollout or in an incident.
func TestChartRenders(t *testing.T) {
	c := loadChart(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			files, err := render(t, c, vs.values)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			r := decode(t, files)
			checkDeployment(t, r, vs.redisMode, vs.istio)
			checkServices(t, r)
			checkAvailability(t, r)
			checkNetworkPolicy(t, r)
			checkIstio(t, r, vs.istio)
			for _, sa := range r.serviceAccounts {
				if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
					t.Errorf("ServiceAccount %s mounts its token: the service never calls the Kubernetes API", sa.Name)
				}
			}
			if r.serviceMonitor != nil {
				ep := r.serviceMonitor.Spec.Endpoints
				if len(ep) != 1 || ep[0].Port != "admin" || ep[0].Path != "/metrics" {
					t.Errorf("ServiceMonitor endpoints %+v: want the admin port's /metrics", ep)
				}
				if !matches(r.serviceMonitor.Spec.Selector.MatchLabels, r.services[r.deployment.Name+"-admin"].Labels) {
					t.Errorf("ServiceMonitor selects %v: not the admin Service", r.serviceMonitor.Spec.Selector.MatchLabels)
				}
			}
		})
	}
}

func checkDeployment(t *testing.T, r *rendered, redisMode string, istio bool) {
	t.Helper()
	d := r.deployment
	if d == nil {
		t.Fatal("no Deployment")
	}
	pod := d.Spec.Template.Spec
	if !matches(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Fatalf("selector %v does not select the pod labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	// Security context: non-root with a numeric id, no privilege, read-only root.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot, a non-zero runAsUser, seccomp RuntimeDefault", psc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	ct := pod.Containers[0]
	sc := ct.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, all capabilities dropped", sc)
	}
	// Probes: readiness /readyz and liveness /healthz on the sync port.
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", ct.ReadinessProbe, "/readyz"}, {"liveness", ct.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe %+v: want GET %s on port http", p.name, p.probe, p.path)
		}
	}
	if ct.Resources.Requests.Cpu().IsZero() || ct.Resources.Requests.Memory().IsZero() {
		t.Errorf("resource requests %v: want cpu and memory", ct.Resources.Requests)
	}
	// Graceful shutdown: the kubelet waits longer than the preStop sleep plus the drain.
	flags := argMap(t, ct.Args)
	drain, err := strconv.Atoi(strings.TrimSuffix(flags["shutdown-timeout"], "s"))
	if err != nil {
		t.Fatalf("--shutdown-timeout %q", flags["shutdown-timeout"])
	}
	sleep := int64(0)
	if ct.Lifecycle != nil && ct.Lifecycle.PreStop != nil && ct.Lifecycle.PreStop.Sleep != nil {
		sleep = ct.Lifecycle.PreStop.Sleep.Seconds
	}
	grace := int64(30) // the Kubernetes default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	if sleep == 0 || grace <= sleep+int64(drain) {
		t.Errorf("preStop sleep %d s, drain %d s, grace period %d s: want a sleep and a grace period longer than both", sleep, drain, grace)
	}
	if mu := d.Spec.Strategy.RollingUpdate; mu == nil || mu.MaxUnavailable == nil || mu.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v: want maxUnavailable 0 (a replica keeps serving during an upgrade)", mu)
	}

	// Every flag exists in the service; secrets only as files, and every file is mounted.
	known, err := serviceFlags()
	if err != nil {
		t.Fatal(err)
	}
	for f := range flags {
		if !known[f] {
			t.Errorf("--%s: not a flag of tollgate-ratelimit", f)
		}
	}
	for _, f := range []string{"sync-secret", "admin-token", "redis-password"} {
		if _, ok := flags[f]; ok {
			t.Errorf("--%s given as a value: secrets are mounted files", f)
		}
	}
	for _, e := range ct.Env {
		if e.Value != "" {
			t.Errorf("env %s has a literal value: the chart passes nothing but flags and files", e.Name)
		}
	}
	mounted := mountedFiles(ct, pod.Volumes)
	for f, v := range flags {
		if strings.HasSuffix(f, "-file") && !mounted[v] {
			t.Errorf("--%s=%s: no mounted Secret item provides that file (mounted: %v)", f, v, mounted)
		}
	}
	// The policy store's password comes from a mounted password file named in the URL,
	// never from the URL itself.
	if ps, ok := flags["policy-store"]; ok {
		u, err := url.Parse(ps)
		if err != nil {
			t.Fatalf("--policy-store %q: %v", ps, err)
		}
		if _, set := u.User.Password(); set || u.Query().Has("password") {
			t.Errorf("--policy-store %q carries a password", ps)
		}
		if pf := u.Query().Get("passfile"); pf != "" && !mounted[pf] {
			t.Errorf("--policy-store passfile=%s: no mounted Secret item provides that file (mounted: %v)", pf, mounted)
		}
	}
	if flags["redis-mode"] != redisMode {
		t.Errorf("--redis-mode %q, want %q", flags["redis-mode"], redisMode)
	}
	if _, insecure := flags["insecure"]; insecure {
		t.Error("--insecure set: gateways authenticate by node tokens or, under Istio, by their mTLS identity")
	}
	if mesh := flags["sync-identity"] == "mesh"; mesh != istio {
		t.Errorf("--sync-identity=mesh: %v, want it exactly when gateways authenticate by Istio mTLS (%v)", mesh, istio)
	}
	if !istio && flags["sync-secret-file"] == "" {
		t.Error("no --sync-secret-file without Istio")
	}
}

func checkServices(t *testing.T, r *rendered) {
	t.Helper()
	name := r.deployment.Name
	sync, admin := r.services[name], r.services[name+"-admin"]
	if sync == nil || admin == nil || len(r.services) != 2 {
		t.Fatalf("Services %v: want %s (sync) and %s-admin", keys(r.services), name, name)
	}
	for _, s := range []struct {
		svc  *corev1.Service
		port string
	}{{sync, "http"}, {admin, "admin"}} {
		if len(s.svc.Spec.Ports) != 1 || s.svc.Spec.Ports[0].Name != s.port || s.svc.Spec.Ports[0].TargetPort.String() != s.port {
			t.Errorf("Service %s ports %+v: want only %s", s.svc.Name, s.svc.Spec.Ports, s.port)
		}
		if !matches(s.svc.Spec.Selector, r.deployment.Spec.Template.Labels) {
			t.Errorf("Service %s selects %v: not the pods", s.svc.Name, s.svc.Spec.Selector)
		}
	}
}

func checkAvailability(t *testing.T, r *rendered) {
	t.Helper()
	d := r.deployment
	minReplicas := int32(1)
	if d.Spec.Replicas != nil {
		minReplicas = *d.Spec.Replicas
	}
	if r.hpa != nil {
		if d.Spec.Replicas != nil {
			t.Error("replicas set with an HPA: every upgrade would reset the scale")
		}
		if r.hpa.Spec.MinReplicas != nil {
			minReplicas = *r.hpa.Spec.MinReplicas
		}
		if r.hpa.Spec.ScaleTargetRef.Name != d.Name || r.hpa.Spec.ScaleTargetRef.Kind != "Deployment" {
			t.Errorf("HPA targets %+v", r.hpa.Spec.ScaleTargetRef)
		}
	}
	if minReplicas < 2 {
		t.Errorf("at least %d replica(s): want 2 so one serves while the other restarts", minReplicas)
	}
	if r.pdb == nil || r.pdb.Spec.MinAvailable == nil || r.pdb.Spec.MinAvailable.IntValue() < 1 ||
		!matches(r.pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PodDisruptionBudget %+v: want minAvailable >= 1 over the pods", r.pdb)
	}
}

// checkNetworkPolicy: the sync port and the admin port are opened by separate rules to
// separate peers, and no rule opens every port or admits everyone.
func checkNetworkPolicy(t *testing.T, r *rendered) {
	t.Helper()
	np := r.netpol
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	if !matches(np.Spec.PodSelector.MatchLabels, r.deployment.Spec.Template.Labels) {
		t.Fatalf("NetworkPolicy selects %v: not the pods", np.Spec.PodSelector.MatchLabels)
	}
	peers := map[string]string{}
	for i, rule := range np.Spec.Ingress {
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil {
			t.Fatalf("ingress rule %d opens ports %+v: want exactly one", i, rule.Ports)
		}
		if len(rule.From) == 0 {
			t.Fatalf("ingress rule %d admits every peer", i)
		}
		p := rule.Ports[0].Port.String()
		if _, dup := peers[p]; dup {
			t.Fatalf("port %s opened by two rules", p)
		}
		b, _ := json.Marshal(rule.From)
		peers[p] = string(b)
	}
	syncPort, adminPort := containerPort(t, r, "http"), containerPort(t, r, "admin")
	if peers[syncPort] == "" || peers[adminPort] == "" {
		t.Fatalf("NetworkPolicy opens %v: want the sync port %s and the admin port %s", keys(peers), syncPort, adminPort)
	}
	if peers[syncPort] == peers[adminPort] {
		t.Errorf("the sync and admin ports admit the same peers: %s", peers[syncPort])
	}
}

func checkIstio(t *testing.T, r *rendered, want bool) {
	t.Helper()
	if (r.istio != nil) != want {
		t.Fatalf("Istio objects rendered: %v, want %v", r.istio != nil, want)
	}
	if !want {
		return
	}
	is := r.istio
	host := r.deployment.Name + "." + namespace + ".svc.cluster.local"
	if is.SyncHost != host || strconv.Itoa(is.SyncPort) != containerPort(t, r, "http") {
		t.Errorf("sync.cluster names %s:%d, want the sync Service %s:%s", is.SyncHost, is.SyncPort, host, containerPort(t, r, "http"))
	}
	if is.Rules.Sync.Authority != host {
		t.Errorf("sync.authority %q, want %q", is.Rules.Sync.Authority, host)
	}
	if strings.Contains(string(is.RulesJSON), `"secret"`) {
		t.Errorf("the WasmPlugin carries a secret: %s", is.RulesJSON)
	}
	if len(is.DestinationRules) != 1 || is.DestinationRules[0].GetHost() != host {
		t.Errorf("DestinationRules %v: want one for %s", is.DestinationRules, host)
	}
	if len(is.ServiceEntries) != 1 || !slices.Contains(is.ServiceEntries[0].GetHosts(), host) {
		t.Errorf("ServiceEntries %v: want one for %s", is.ServiceEntries, host)
	}
	// mTLS is the gateways' credential: STRICT on the sync port, and only the gateways'
	// principals reach it.
	sp := containerPort(t, r, "http")
	if len(is.PeerAuthentications) != 1 || is.PeerAuthentications[0].GetPortLevelMtls()[uint32(atoi(sp))].GetMode().String() != "STRICT" {
		t.Errorf("PeerAuthentication %v: want STRICT mTLS on port %s", is.PeerAuthentications, sp)
	}
	if len(is.AuthorizationPolicies) != 1 {
		t.Fatalf("%d AuthorizationPolicies, want 1", len(is.AuthorizationPolicies))
	}
	ap := is.AuthorizationPolicies[0]
	if ap.GetAction().String() != "ALLOW" || !matches(ap.GetSelector().GetMatchLabels(), r.deployment.Spec.Template.Labels) {
		t.Fatalf("AuthorizationPolicy %v: want ALLOW over the pods", ap)
	}
	for _, rule := range ap.GetRules() {
		for _, to := range rule.GetTo() {
			if !slices.Contains(to.GetOperation().GetPorts(), sp) {
				continue
			}
			if len(rule.GetFrom()) == 0 || len(rule.GetFrom()[0].GetSource().GetPrincipals()) == 0 {
				t.Errorf("AuthorizationPolicy admits anyone to the sync port: %v", rule)
			}
		}
	}
}

// TestChartOptionalSecrets: the policy store and the key-hash secret render their
// flag, and mount their Secret, exactly when set.
func TestChartOptionalSecrets(t *testing.T) {
	c := loadChart(t)
	const pgURL = "postgres://tollgate@pg-rw.db.svc:5432/tollgate"
	tests := []struct {
		name, values string
		wantFlags    map[string]string // flag → value; "" absent
		wantItems    map[string]string // mounted file → Secret/key
	}{
		{name: "none", wantFlags: map[string]string{"policy-store": "", "key-hash-secret-file": ""}},
		{name: "policy store without password", values: "policyStore: {url: " + pgURL + "}",
			wantFlags: map[string]string{"policy-store": pgURL}},
		{name: "policy store with passfile", values: "policyStore: {url: " + pgURL + ", passfile: {secretName: pg-app}}",
			wantFlags: map[string]string{"policy-store": pgURL + "?passfile=/etc/tollgate/secrets/pgpass"},
			wantItems: map[string]string{"/etc/tollgate/secrets/pgpass": "pg-app/pgpass"}},
		{name: "policy store URL with parameters", values: "policyStore: {url: '" + pgURL + "?sslmode=verify-full', passfile: {secretName: pg, key: pass}}",
			wantFlags: map[string]string{"policy-store": pgURL + "?sslmode=verify-full&passfile=/etc/tollgate/secrets/pgpass"},
			wantItems: map[string]string{"/etc/tollgate/secrets/pgpass": "pg/pass"}},
		{name: "key hash secret", values: "secrets: {keyHash: {secretName: kh}}",
			wantFlags: map[string]string{"key-hash-secret-file": "/etc/tollgate/secrets/key-hash-secret", "policy-store": ""},
			wantItems: map[string]string{"/etc/tollgate/secrets/key-hash-secret": "kh/key-hash-secret"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files, err := render(t, c, tc.values)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			r := decode(t, files)
			checkDeployment(t, r, "standalone", false)
			ct := r.deployment.Spec.Template.Spec.Containers[0]
			flags := argMap(t, ct.Args)
			for f, want := range tc.wantFlags {
				if got, ok := flags[f]; got != want || ok != (want != "") {
					t.Errorf("--%s = %q (set: %v), want %q", f, got, ok, want)
				}
			}
			items := secretItems(ct, r.deployment.Spec.Template.Spec.Volumes)
			for _, f := range []string{"/etc/tollgate/secrets/pgpass", "/etc/tollgate/secrets/key-hash-secret"} {
				if items[f] != tc.wantItems[f] {
					t.Errorf("%s from %q, want %q", f, items[f], tc.wantItems[f])
				}
			}
			if len(ct.Env) != 0 {
				t.Errorf("env %v: the policy store's password is a mounted file, not an environment value", ct.Env)
			}
		})
	}
}

// TestChartRuleStatsNotes: with istio.ruleStats the install notes carry the gateway
// pods' proxy.istio.io/config annotation, as a kubectl patch. The annotation must be a
// valid Istio ProxyConfig that keeps the filter's per-rule stats and whose extra stat
// tag generates the regex that extracts the rule id from their names.
func TestChartRuleStatsNotes(t *testing.T) {
	c := loadChart(t)
	stat := "wasmcustom." + plugin.RuleStatName("v2-burst", "limited")
	tests := []struct {
		name, values string
		want         bool
	}{
		{name: "istio", values: "istio: {enabled: true}", want: true},
		{name: "istio without rule stats", values: "istio: {enabled: true, ruleStats: {enabled: false}}"},
		{name: "no istio", values: ""},
	}
	patchRe := regexp.MustCompile(`(?m)^\s*kubectl -n istio-ingress patch "\$d" --type merge -p '([^']*)'$`)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files, err := render(t, c, tc.values)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			notes := files["tollgate/templates/NOTES.txt"]
			m := patchRe.FindStringSubmatch(notes)
			if (m != nil) != tc.want {
				t.Fatalf("notes carry the gateway patch: %v, want %v:\n%s", m != nil, tc.want, notes)
			}
			if !tc.want {
				return
			}
			if !strings.Contains(notes, "get deploy -l istio=ingressgateway ") {
				t.Errorf("notes do not select the WasmPlugin's gateways:\n%s", notes)
			}
			var patch struct {
				Spec struct {
					Template struct {
						Metadata struct {
							Annotations map[string]string `json:"annotations"`
						} `json:"metadata"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := json.Unmarshal([]byte(m[1]), &patch); err != nil {
				t.Fatalf("patch %s: %v", m[1], err)
			}
			ann := patch.Spec.Template.Metadata.Annotations
			if len(ann) != 1 || ann["proxy.istio.io/config"] == "" {
				t.Fatalf("patch annotations %v: want only proxy.istio.io/config", ann)
			}
			if !strings.Contains(notes, "proxy.istio.io/config: |") {
				t.Errorf("notes do not show the annotation as YAML:\n%s", notes)
			}
			js, err := yaml.YAMLToJSONStrict([]byte(ann["proxy.istio.io/config"]))
			if err != nil {
				t.Fatal(err)
			}
			pc := &meshv1alpha1.ProxyConfig{}
			if err := protojson.Unmarshal(js, pc); err != nil {
				t.Fatalf("proxy.istio.io/config is not an Istio ProxyConfig: %v", err)
			}
			kept := false
			for _, re := range pc.GetProxyStatsMatcher().GetInclusionRegexps() {
				kept = kept || regexp.MustCompile("^(?:"+re+")$").MatchString(stat)
			}
			if !kept {
				t.Errorf("proxyStatsMatcher %v drops %s", pc.GetProxyStatsMatcher(), stat)
			}
			// Istio turns each extra stat tag into the stats_tags regex (<tag>=\.=(.+?);\.;).
			extracted := false
			for _, tag := range pc.GetExtraStatTags() {
				re := fmt.Sprintf(`(%s=\.=(.+?);\.;)`, regexp.QuoteMeta(tag))
				if sm := regexp.MustCompile(re).FindStringSubmatch(stat); re == plugin.RuleStatsTagRegex && sm != nil && sm[2] == "v2-burst" {
					extracted = true
				}
			}
			if !extracted {
				t.Errorf("extraStatTags %v: none generates %s, which extracts the rule from %s", pc.GetExtraStatTags(), plugin.RuleStatsTagRegex, stat)
			}
		})
	}
}

// TestChartRefuses: values that would deploy something broken or open fail the render
// with a message naming the value.
func TestChartRefuses(t *testing.T) {
	c := loadChart(t)
	tests := []struct{ name, values, want string }{
		{"no sync secret without Istio", `secrets: {sync: {secretName: ""}}`, "secrets.sync.secretName"},
		{"unknown redis mode", `redis: {mode: replicated}`, "redis"},
		{"sentinel without master", `redis: {mode: sentinel}`, "redis.masterName"},
		{"two addresses standalone", `redis: {addrs: [a:1, b:2]}`, "redis.addrs"},
		{"client certificate without TLS", `redis: {tls: {clientCertSecret: {secretName: x}}}`, "redis.tls"},
		{"secret in the WasmPlugin", `istio: {enabled: true, wasmPlugin: {pluginConfig: {version: 1, sync: {secret: s}, rules: []}}}`, "pluginConfig.sync.secret"},
		{"unknown value", `replicas: 3`, "replicas"},
		{"address with a scheme", `redis: {addrs: ["rediss://r:6379"]}`, "addrs"},
		{"flag given as a value", `extraArgs: [sync-secret]`, "extraArgs"},
		{"password in the policy store URL", `policyStore: {url: "postgres://tollgate:hunter2@pg/tollgate"}`, "policyStore.url"},
		{"password parameter in the policy store URL", `policyStore: {url: "postgres://tollgate@pg/tollgate?sslmode=require&password=hunter2"}`, "policyStore.url"},
		{"passfile parameter beside policyStore.passfile", `policyStore: {url: "postgres://tollgate@pg/tollgate?passfile=/tmp/p"}`, "policyStore.url"},
		{"policy store that is not a PostgreSQL URL", `policyStore: {url: "host=pg user=tollgate"}`, "policyStore"},
		{"passfile without a policy store", `policyStore: {passfile: {secretName: pg-app}}`, "policyStore.passfile"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, c, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// argMap reads --name=value arguments (a bare --name maps to "").
func argMap(t *testing.T, args []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			t.Fatalf("argument %q: want --name=value", a)
		}
		k, v, _ := strings.Cut(name, "=")
		m[k] = v
	}
	return m
}

// mountedFiles lists the files the container sees from projected Secret volumes.
func mountedFiles(ct corev1.Container, vols []corev1.Volume) map[string]bool {
	files := map[string]bool{}
	for f := range secretItems(ct, vols) {
		files[f] = true
	}
	return files
}

// secretItems maps each file the container sees from projected Secret volumes to
// the Secret and key it comes from ("name/key").
func secretItems(ct corev1.Container, vols []corev1.Volume) map[string]string {
	items := map[string]string{}
	for _, vm := range ct.VolumeMounts {
		for _, v := range vols {
			if v.Name != vm.Name || v.Projected == nil {
				continue
			}
			for _, src := range v.Projected.Sources {
				if src.Secret == nil {
					continue
				}
				for _, it := range src.Secret.Items {
					items[path.Join(vm.MountPath, it.Path)] = src.Secret.Name + "/" + it.Key
				}
			}
		}
	}
	return items
}

func containerPort(t *testing.T, r *rendered, name string) string {
	t.Helper()
	for _, p := range r.deployment.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == name {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	t.Fatalf("no container port %q", name)
	return ""
}

// matches reports whether selector selects labels.
func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
