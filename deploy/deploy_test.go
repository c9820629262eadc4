// Package deploy_test checks the deployment files, which nothing here can
// run: docker-compose.yml, deploy/Dockerfile and deploy/k8s. They must parse,
// hold the objects operators expect, and name only variables config.Load
// knows, with values it accepts.
package deploy_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/klaxonhq/klaxon/internal/config"
	"github.com/klaxonhq/klaxon/internal/notify/email"
)

const metricsPort = 9464

// minGrace is the least time a worker must be given between SIGTERM and
// SIGKILL: Klaxon exits within 10 s of SIGTERM (docs/contract.md §7), plus a margin.
const minGrace = 15 * time.Second

// knownVariables maps every name config.Load reads, Hawk aliases included.
func knownVariables() map[string]bool {
	known := map[string]bool{}
	for _, v := range config.Variables() {
		known[v.Name] = true
		if v.Alias != "" {
			known[v.Alias] = true
		}
	}
	return known
}

// isGoRuntime reports whether name is one of the Go runtime's variables a
// deployment may set for the worker: read by Go, not by config.Load.
func isGoRuntime(name string) bool {
	switch name {
	case "GOGC", "GOMEMLIMIT", "GOMAXPROCS":
		return true
	}
	return false
}

// documentedVariables maps every name in docs/configuration.md's table of
// variables: the first column (the KLAXON_ name) and the third (Hawk alias).
func documentedVariables(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for line := range strings.Lines(string(raw)) {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 5 {
			continue
		}
		for _, cell := range []string{cells[1], cells[3]} {
			if name := strings.Trim(strings.TrimSpace(cell), "`"); name != "" {
				documented[name] = true
			}
		}
	}
	return documented
}

// checkNames fails for every name config.Load does not read, or that
// docs/configuration.md does not describe.
func checkNames(t *testing.T, where string, env map[string]string) {
	t.Helper()
	known, documented := knownVariables(), documentedVariables(t)
	for name := range env {
		if isGoRuntime(name) {
			continue // Go's own, which the README's Memory and CPU notes discuss
		}
		if !known[name] {
			t.Errorf("%s: %s is not a variable Klaxon reads (see docs/configuration.md)", where, name)
		} else if !documented[name] {
			t.Errorf("%s: %s is not in docs/configuration.md's table", where, name)
		}
	}
}

// The names above come from config.Variables(); it must list every Env*
// constant of internal/config (what Load reads), and nothing else, or a
// valid variable is refused here and a dropped one still accepted.
func TestVariablesMatchEnvConstants(t *testing.T) {
	files, err := filepath.Glob("../internal/config/*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var consts []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		consts = append(consts, envConstants(f)...)
	}
	var listed []string
	for _, v := range config.Variables() {
		listed = append(listed, v.Name)
	}
	slices.Sort(consts)
	slices.Sort(listed)
	if len(consts) < 20 || !slices.Equal(consts, listed) {
		t.Errorf("Env* constants of internal/config %v\ndiffer from config.Variables() %v", consts, listed)
	}
	documented := documentedVariables(t)
	for _, v := range config.Variables() {
		if !documented[v.Name] || (v.Alias != "" && !documented[v.Alias]) {
			t.Errorf("%s (alias %q) is missing from docs/configuration.md's table", v.Name, v.Alias)
		}
	}
}

// envConstants are the values of the string constants named Env* in f.
func envConstants(f *ast.File) []string {
	var consts []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, id := range vs.Names {
			if !strings.HasPrefix(id.Name, "Env") || i >= len(vs.Values) {
				continue
			}
			if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				v, _ := strconv.Unquote(lit.Value)
				consts = append(consts, v)
			}
		}
		return true
	})
	return consts
}

// checkVariables checks the names and that config.Load accepts the values
// together.
func checkVariables(t *testing.T, where string, env map[string]string) config.Config {
	t.Helper()
	checkNames(t, where, env)
	c, err := config.Load(func(k string) string { return env[k] })
	if err != nil {
		t.Errorf("%s: config.Load rejects the values: %v", where, err)
	}
	return c
}

// The check above must catch a misspelling, or it checks nothing.
func TestCheckVariablesCatchesMisspelling(t *testing.T) {
	known := knownVariables()
	for _, name := range []string{"KLAXON_QUEU", "KLAXN_QUEUE", "KLAXON_SMTP_PASS", "REDIS_URI"} {
		if known[name] {
			t.Errorf("%s is accepted as a known variable", name)
		}
	}
	if !known["KLAXON_QUEUE"] || !known["REDIS_URL"] {
		t.Error("known variables lack KLAXON_QUEUE or REDIS_URL")
	}
}

// listenPort checks that addr is reachable from outside a container.
func listenPort(t *testing.T, where, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: KLAXON_HTTP_ADDR %q: %v", where, addr, err)
		return
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("%s: KLAXON_HTTP_ADDR %q listens on loopback only: probes and Prometheus cannot reach it", where, addr)
	}
	if port != "9464" {
		t.Errorf("%s: KLAXON_HTTP_ADDR %q: want port %d", where, addr, metricsPort)
	}
}

// --- docker-compose.yml ---

type composeFile struct {
	Services map[string]struct {
		Image string `yaml:"image"`
		Build struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Deploy struct {
			Replicas int `yaml:"replicas"`
		} `yaml:"deploy"`
		Environment yaml.Node `yaml:"environment"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		ContainerName   string    `yaml:"container_name"`
		Hostname        string    `yaml:"hostname"`
		Command         yaml.Node `yaml:"command"` // a string or a list
		Volumes         yaml.Node `yaml:"volumes"` // short or long syntax
		StopGracePeriod string    `yaml:"stop_grace_period"`
	} `yaml:"services"`
}

// words splits a Compose command, in either of its forms, into words.
func words(t *testing.T, n yaml.Node) []string {
	t.Helper()
	switch n.Kind {
	case 0:
		return nil
	case yaml.ScalarNode:
		return strings.Fields(n.Value)
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			t.Fatalf("command: %v", err)
		}
		return list
	}
	t.Fatalf("command is neither a string nor a list")
	return nil
}

// mountTargets lists the container paths of a service's volumes.
func mountTargets(t *testing.T, n yaml.Node) []string {
	t.Helper()
	var targets []string
	for _, v := range n.Content {
		switch v.Kind {
		case yaml.ScalarNode: // source:target[:mode]
			parts := strings.Split(v.Value, ":")
			if len(parts) == 1 {
				targets = append(targets, parts[0])
			} else {
				targets = append(targets, parts[1])
			}
		case yaml.MappingNode:
			var long struct {
				Target string `yaml:"target"`
			}
			if err := v.Decode(&long); err != nil {
				t.Fatalf("volumes: %v", err)
			}
			targets = append(targets, long.Target)
		}
	}
	return targets
}

// environment reads a Compose environment in either of its forms: a map, or
// a list of NAME=value.
func environment(t *testing.T, n yaml.Node) map[string]string {
	t.Helper()
	env := map[string]string{}
	switch n.Kind {
	case 0:
	case yaml.MappingNode:
		if err := n.Decode(&env); err != nil {
			t.Fatalf("environment: %v", err)
		}
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			t.Fatalf("environment: %v", err)
		}
		for _, item := range list {
			k, v, _ := strings.Cut(item, "=")
			env[k] = v
		}
	default:
		t.Fatalf("environment is neither a map nor a list")
	}
	return env
}

func TestCompose(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}

	images := map[string]string{
		"rabbitmq": "rabbitmq:3-management",
		"redis":    "redis:7",
		"mongo":    "mongo:7",
		"mailpit":  "axllent/mailpit",
	}
	for name, image := range images {
		s, ok := f.Services[name]
		if !ok {
			t.Errorf("no service %s", name)
			continue
		}
		if s.Image != image {
			t.Errorf("service %s: image %q, want %q", name, s.Image, image)
		}
		if len(s.Healthcheck.Test) == 0 {
			t.Errorf("service %s has no healthcheck", name)
		}
	}

	k, ok := f.Services["klaxon-worker"]
	if !ok {
		t.Fatal("no service klaxon-worker")
	}
	if args := words(t, k.Command); len(args) > 0 {
		t.Errorf("klaxon-worker has command %q: the worker takes no arguments and would exit 2", args)
	}
	if k.Build.Dockerfile != "deploy/Dockerfile" || (k.Build.Context != "." && k.Build.Context != "") {
		t.Errorf("klaxon-worker builds %q in %q, want deploy/Dockerfile in .", k.Build.Dockerfile, k.Build.Context)
	}
	if k.Deploy.Replicas != 3 {
		t.Errorf("klaxon-worker replicas = %d, want 3", k.Deploy.Replicas)
	}
	if k.ContainerName != "" {
		t.Error("klaxon-worker has a container_name, which forbids replicas")
	}
	for name := range images {
		if c := k.DependsOn[name].Condition; c != "service_healthy" {
			t.Errorf("klaxon-worker depends on %s with condition %q, want service_healthy", name, c)
		}
	}
	// Compose's default is 10 s, all the worker may take: leave a margin.
	if grace, err := time.ParseDuration(k.StopGracePeriod); err != nil || grace < minGrace {
		t.Errorf("klaxon stop_grace_period %q; Klaxon needs up to 10 s after SIGTERM, give it at least %v", k.StopGracePeriod, minGrace)
	}

	// RabbitMQ stores its data under rabbit@<hostname>: a recreated container
	// with Docker's random hostname starts empty beside its old queues.
	r := f.Services["rabbitmq"]
	if slices.Contains(mountTargets(t, r.Volumes), "/var/lib/rabbitmq") && r.Hostname == "" {
		t.Error("rabbitmq keeps /var/lib/rabbitmq in a volume but has no fixed hostname: a recreated container loses its queues")
	}
	// docs/guarantees.md: Redis must persist with an append-only file.
	cmd := words(t, f.Services["redis"].Command)
	if i := slices.Index(cmd, "--appendonly"); i < 0 || i+1 >= len(cmd) || cmd[i+1] != "yes" {
		t.Errorf("redis command %q lacks --appendonly yes, which Klaxon's guarantees require", cmd)
	}

	env := environment(t, k.Environment)
	c := checkVariables(t, "docker-compose.yml", env)
	listenPort(t, "docker-compose.yml", c.HTTPAddr)
	for name, host := range map[string]string{"KLAXON_AMQP_URL": "@rabbitmq:", "KLAXON_REDIS_URL": "//redis:", "KLAXON_MONGO_URL": "//mongo:", "KLAXON_SMTP_ADDR": "mailpit:1025"} {
		if !strings.Contains(env[name], host) {
			t.Errorf("docker-compose.yml: %s=%q does not point at %s", name, env[name], host)
		}
	}
	if c.SMTPTLS != email.TLSNone {
		t.Errorf("docker-compose.yml: Mailpit speaks plain SMTP, KLAXON_SMTP_TLS is %q", c.SMTPTLS)
	}
}

// --- deploy/Dockerfile ---

func TestDockerfile(t *testing.T) {
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var stages []string // each stage's FROM line
	var build []string  // every instruction
	var final []string  // the final stage's instructions
	var line strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		text := strings.TrimSpace(sc.Text())
		if line.Len() == 0 && (text == "" || strings.HasPrefix(text, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(text, "\\"); ok {
			line.WriteString(cont + " ")
			continue
		}
		line.WriteString(text)
		instr := line.String()
		line.Reset()
		if strings.HasPrefix(strings.ToUpper(instr), "FROM ") {
			stages = append(stages, instr)
			final = nil
		}
		final = append(final, instr)
		build = append(build, instr)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d FROM stages, want a builder and a final image", len(stages))
	}
	if !strings.Contains(stages[0], "golang:1.26") {
		t.Errorf("builder stage %q is not golang:1.26", stages[0])
	}
	last := stages[len(stages)-1]
	if !strings.Contains(last, "distroless") {
		t.Errorf("final stage %q is not distroless", last)
	}

	env := map[string]string{}
	var user, entrypoint, expose string
	var copies [][]string // the final stage's COPY --from=... instructions, as words
	for _, instr := range final {
		keyword, args, _ := strings.Cut(instr, " ")
		switch strings.ToUpper(keyword) {
		case "USER":
			user = args
		case "ENTRYPOINT":
			entrypoint = args
		case "COPY":
			if strings.Contains(args, "--from=") {
				copies = append(copies, strings.Fields(args))
			}
		case "EXPOSE":
			expose = args
		case "ENV":
			for kv := range strings.FieldsSeq(args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Errorf("ENV %q: use the NAME=value form", args)
				}
				env[k] = v
			}
		}
	}
	var image string // FROM [--platform=...] image [AS name]
	for _, f := range strings.Fields(last)[1:] {
		if !strings.HasPrefix(f, "--") {
			image = f
			break
		}
	}
	nonRootImage := strings.HasSuffix(image, ":nonroot")
	if user == "" && !nonRootImage {
		t.Error("final image runs as root: no USER and not a :nonroot base")
	}
	if u, _, _ := strings.Cut(user, ":"); u == "root" || u == "0" {
		t.Errorf("final image runs as USER %s", user)
	}
	checkBinary(t, build, copies, entrypoint)
	if !slices.Contains(strings.Fields(expose), "9464") {
		t.Errorf("EXPOSE %q lacks %d", expose, metricsPort)
	}
	c := checkVariables(t, "Dockerfile", env)
	listenPort(t, "Dockerfile", c.HTTPAddr)
	if !strings.Contains(strings.Join(build, "\n"), "CGO_ENABLED=0") {
		t.Error("the binary is not built with CGO_ENABLED=0, which distroless/static needs")
	}
}

// checkBinary follows both binaries from go build to where they run: the
// build compiles ./cmd/worker and ./cmd/klaxon, the final stage copies
// them to /usr/local/bin/klaxon-worker and /usr/local/bin/klaxon (one name
// per binary: a worker called klaxon once took "klaxon --help" for a start),
// and ENTRYPOINT runs the worker, in exec form since the distroless image
// has no shell.
func checkBinary(t *testing.T, build []string, copies [][]string, entrypoint string) {
	t.Helper()
	outs := map[string]string{} // package → output file
	for _, instr := range build {
		parts := strings.Split(instr, "go build ")
		for _, cmd := range parts[1:] {
			cmd, _, _ = strings.Cut(cmd, "&&")
			fields := strings.Fields(strings.TrimSuffix(strings.TrimSpace(cmd), "\\"))
			var out string
			for i, f := range fields {
				if f == "-o" && i+1 < len(fields) {
					out = fields[i+1]
				} else if o, ok := strings.CutPrefix(f, "-o="); ok {
					out = o
				}
			}
			if len(fields) > 0 && out != "" {
				outs[fields[len(fields)-1]] = out
			}
		}
	}
	installedAs := func(pkg string) string {
		out := outs[pkg]
		if out == "" {
			t.Fatalf("the build stage does not go build -o <file> %s (builds %v)", pkg, outs)
		}
		for _, words := range copies {
			var args []string
			for _, w := range words {
				if !strings.HasPrefix(w, "--") {
					args = append(args, w)
				}
			}
			if len(args) == 2 && path.Clean(args[0]) == path.Clean(out) {
				installed := args[1]
				if strings.HasSuffix(installed, "/") {
					installed += path.Base(out)
				}
				return installed
			}
		}
		t.Fatalf("the final stage does not COPY --from the build's %s", out)
		return ""
	}
	worker, tool := installedAs("./cmd/worker"), installedAs("./cmd/klaxon")
	if worker != "/usr/local/bin/klaxon-worker" || tool != "/usr/local/bin/klaxon" {
		t.Errorf("the worker is installed as %s and the tool as %s; want /usr/local/bin/klaxon-worker and /usr/local/bin/klaxon", worker, tool)
	}

	var argv []string
	if err := json.Unmarshal([]byte(entrypoint), &argv); err != nil || len(argv) == 0 {
		t.Fatalf("ENTRYPOINT %s is not in exec form [\"/path\"]; the distroless image has no shell", entrypoint)
	}
	if path.Clean(argv[0]) != path.Clean(worker) {
		t.Errorf("ENTRYPOINT runs %s, but the worker is copied to %s", argv[0], worker)
	}
}

// --- deploy/k8s ---

type object struct {
	file       string
	node       yaml.Node // the document, for what decoding loses (tags)
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`       // ConfigMap, Secret (base64)
	StringData map[string]string `yaml:"stringData"` // Secret
	Resources  []string          `yaml:"resources"`  // Kustomization
	Spec       yaml.Node         `yaml:"spec"`
}

// readManifests decodes every document of every YAML file under dir.
func readManifests(t *testing.T, dir string) []object {
	t.Helper()
	var objs []object
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		dec := yaml.NewDecoder(f)
		for {
			var o object
			err := dec.Decode(&o.node)
			if errors.Is(err, io.EOF) {
				break
			}
			if err == nil {
				err = o.node.Decode(&o)
			}
			if err != nil {
				t.Errorf("%s: %v", path, err)
				break
			}
			if o.Kind == "" {
				continue // an empty document
			}
			if o.APIVersion == "" {
				t.Errorf("%s: %s has no apiVersion", path, o.Kind)
			}
			o.file = path
			objs = append(objs, o)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
}

type probe struct {
	HTTPGet struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type deploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
			SecurityContext               struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
				RunAsUser    *int `yaml:"runAsUser"`
			} `yaml:"securityContext"`
			Containers []container `yaml:"containers"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

// checkStrings fails for every value of o's data and stringData that YAML
// reads as something else than a string (2000, true, 5.0, null): the API
// server refuses such a ConfigMap or Secret, where a decoder into strings,
// like this test's, would not notice.
func checkStrings(t *testing.T, o object) {
	t.Helper()
	doc := &o.node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if key := doc.Content[i].Value; key != "data" && key != "stringData" {
			continue
		}
		m := doc.Content[i+1]
		for j := 0; j+1 < len(m.Content); j += 2 {
			if v := m.Content[j+1]; v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				t.Errorf("%s: %s %s is %s %q, not a string: quote it", o.file, o.Kind, m.Content[j].Value, v.ShortTag(), v.Value)
			}
		}
	}
}

// selects reports whether a matchLabels selector picks pods labelled labels.
func selects(selector, labels map[string]string) bool {
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

// manifests indexes the decoded objects by kind.
type manifests map[string][]object

func (m manifests) one(t *testing.T, kind string) object {
	t.Helper()
	if len(m[kind]) != 1 {
		t.Fatalf("want one %s, found %d", kind, len(m[kind]))
	}
	return m[kind][0]
}

func decodeSpec(t *testing.T, o object, v any) {
	t.Helper()
	if err := o.Spec.Decode(v); err != nil {
		t.Fatalf("%s: %s spec: %v", o.file, o.Kind, err)
	}
}

func TestKubernetes(t *testing.T) {
	m := manifests{}
	for _, o := range readManifests(t, "k8s") {
		m[o.Kind] = append(m[o.Kind], o)
	}
	for _, kind := range []string{"Deployment", "ConfigMap", "Secret", "Service", "PodDisruptionBudget", "Kustomization", "ScaledObject", "TriggerAuthentication"} {
		if len(m[kind]) == 0 {
			t.Errorf("no %s under deploy/k8s", kind)
		}
	}

	cm := m.one(t, "ConfigMap")
	secret := m.one(t, "Secret")
	secretValues := map[string]string{}
	for k, v := range secret.Data {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			t.Errorf("Secret data %s is not base64", k)
		}
		secretValues[k] = string(b)
	}
	for k, v := range secret.StringData {
		secretValues[k] = v
	}
	checkNames(t, cm.file, cm.Data)
	checkNames(t, secret.file, secretValues)
	checkStrings(t, cm)
	checkStrings(t, secret)
	for k := range cm.Data {
		if _, ok := secretValues[k]; ok {
			t.Errorf("%s is set in both the ConfigMap and the Secret", k)
		}
	}
	for _, v := range config.Variables() {
		for _, name := range []string{v.Name, v.Alias} {
			if _, inCM := cm.Data[name]; inCM && name != "" && v.Secret {
				t.Errorf("%s holds a secret but is in the ConfigMap", name)
			}
		}
	}

	// The pods the Deployment makes, for the objects that select them.
	var deployment deploymentSpec
	decodeSpec(t, m.one(t, "Deployment"), &deployment)
	podLabels := deployment.Template.Metadata.Labels
	podPorts := map[string]int{}
	for _, c := range deployment.Template.Spec.Containers {
		for _, p := range c.Ports {
			podPorts[p.Name] = p.ContainerPort
		}
	}

	t.Run("Deployment", func(t *testing.T) {
		d := m.one(t, "Deployment")
		var spec deploymentSpec
		decodeSpec(t, d, &spec)
		if spec.Replicas != 3 {
			t.Errorf("replicas = %d, want 3", spec.Replicas)
		}
		for k, v := range spec.Selector.MatchLabels {
			if spec.Template.Metadata.Labels[k] != v {
				t.Errorf("selector %s=%s does not match the pod labels", k, v)
			}
		}
		pod := spec.Template.Spec
		if time.Duration(pod.TerminationGracePeriodSeconds)*time.Second < minGrace {
			t.Errorf("terminationGracePeriodSeconds = %d; Klaxon needs up to 10 s after SIGTERM, give it at least %v", pod.TerminationGracePeriodSeconds, minGrace)
		}
		if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser == nil || *pod.SecurityContext.RunAsUser == 0 {
			t.Error("the pod does not run as a non-root user")
		}
		if len(pod.Containers) != 1 {
			t.Fatalf("want one container, found %d", len(pod.Containers))
		}
		c := pod.Containers[0]
		if len(c.Command) > 0 || len(c.Args) > 0 {
			t.Errorf("container %s has command %q args %q: the image's entrypoint is the worker, which takes no arguments and would exit 2", c.Name, c.Command, c.Args)
		}

		env := map[string]string{}
		for k, v := range cm.Data {
			env[k] = v
		}
		for k, v := range secretValues {
			env[k] = v
		}
		var fromCM, fromSecret bool
		for _, ef := range c.EnvFrom {
			switch {
			case ef.ConfigMapRef != nil:
				fromCM = ef.ConfigMapRef.Name == cm.Metadata.Name
			case ef.SecretRef != nil:
				fromSecret = ef.SecretRef.Name == secret.Metadata.Name
			}
		}
		if !fromCM || !fromSecret {
			t.Errorf("the container does not take its environment from ConfigMap %s and Secret %s", cm.Metadata.Name, secret.Metadata.Name)
		}
		for _, e := range c.Env {
			env[e.Name] = "" // a value from elsewhere; only the name is checked
			if !knownVariables()[e.Name] {
				t.Errorf("container env %s is not a variable Klaxon reads", e.Name)
			}
		}
		cfg := checkVariables(t, "the Deployment's environment", env)
		listenPort(t, "the Deployment's environment", cfg.HTTPAddr)

		portNames := map[string]int{}
		var exposes bool
		for _, p := range c.Ports {
			portNames[p.Name] = p.ContainerPort
			exposes = exposes || p.ContainerPort == metricsPort
		}
		if !exposes {
			t.Errorf("the container does not declare port %d", metricsPort)
		}
		for name, pr := range map[string]struct {
			p    *probe
			path string
		}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
			if pr.p == nil {
				t.Errorf("no %s probe", name)
				continue
			}
			if pr.p.HTTPGet.Path != pr.path {
				t.Errorf("%s probe path %q, want %s", name, pr.p.HTTPGet.Path, pr.path)
			}
			port := pr.p.HTTPGet.Port.Value
			if n, ok := portNames[port]; ok {
				port = strconv.Itoa(n)
			}
			if port != "9464" {
				t.Errorf("%s probe port %q is not %d", name, pr.p.HTTPGet.Port.Value, metricsPort)
			}
		}
		if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
			t.Error("the container lacks cpu/memory requests or a memory limit")
		}
		sc := c.SecurityContext
		if !sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("the container's file system is writable or it may escalate privileges")
		}
	})

	t.Run("Service", func(t *testing.T) {
		s := m.one(t, "Service")
		var spec struct {
			Selector map[string]string `yaml:"selector"`
			Ports    []struct {
				Port       int       `yaml:"port"`
				TargetPort yaml.Node `yaml:"targetPort"` // a number, a port name, or unset (= port)
			} `yaml:"ports"`
		}
		decodeSpec(t, s, &spec)
		if len(spec.Ports) == 0 || spec.Ports[0].Port != metricsPort {
			t.Fatalf("the Service does not expose port %d", metricsPort)
		}
		target := spec.Ports[0].TargetPort.Value
		if n, ok := podPorts[target]; ok {
			target = strconv.Itoa(n)
		} else if target == "" {
			target = strconv.Itoa(spec.Ports[0].Port)
		}
		if target != strconv.Itoa(metricsPort) {
			t.Errorf("the Service sends port %d to the pods' %q, not to %d", metricsPort, spec.Ports[0].TargetPort.Value, metricsPort)
		}
		if !selects(spec.Selector, podLabels) {
			t.Errorf("the Service's selector %v does not select the pods %v", spec.Selector, podLabels)
		}
		a := s.Metadata.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9464" || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("prometheus.io annotations: %v", a)
		}
	})

	t.Run("PodDisruptionBudget", func(t *testing.T) {
		p := m.one(t, "PodDisruptionBudget")
		var spec struct {
			MinAvailable               any    `yaml:"minAvailable"`
			MaxUnavailable             any    `yaml:"maxUnavailable"`
			UnhealthyPodEvictionPolicy string `yaml:"unhealthyPodEvictionPolicy"`
			Selector                   struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		}
		decodeSpec(t, p, &spec)
		if (spec.MinAvailable == nil) == (spec.MaxUnavailable == nil) {
			t.Error("want exactly one of minAvailable and maxUnavailable")
		}
		if !selects(spec.Selector.MatchLabels, podLabels) {
			t.Errorf("the PodDisruptionBudget's selector %v does not select the pods %v", spec.Selector.MatchLabels, podLabels)
		}
		// Every worker is unready while a dependency is down; the default
		// policy would then refuse to evict any of them, blocking node drains.
		if spec.UnhealthyPodEvictionPolicy != "AlwaysAllow" {
			t.Errorf("unhealthyPodEvictionPolicy %q: a dependency outage (every pod unready) would block node drains; want AlwaysAllow", spec.UnhealthyPodEvictionPolicy)
		}
	})

	t.Run("KEDA", func(t *testing.T) {
		so := m.one(t, "ScaledObject")
		ta := m.one(t, "TriggerAuthentication")
		if !strings.Contains(filepath.ToSlash(so.file), "/optional/") || !strings.Contains(filepath.ToSlash(ta.file), "/optional/") {
			t.Error("KEDA objects must stay under deploy/k8s/optional, out of the base")
		}
		var spec struct {
			ScaleTargetRef struct {
				Name string `yaml:"name"`
			} `yaml:"scaleTargetRef"`
			Triggers []struct {
				Type              string            `yaml:"type"`
				Metadata          map[string]string `yaml:"metadata"`
				AuthenticationRef struct {
					Name string `yaml:"name"`
				} `yaml:"authenticationRef"`
			} `yaml:"triggers"`
		}
		decodeSpec(t, so, &spec)
		if spec.ScaleTargetRef.Name != m.one(t, "Deployment").Metadata.Name {
			t.Errorf("ScaledObject targets %q", spec.ScaleTargetRef.Name)
		}
		if len(spec.Triggers) != 1 || spec.Triggers[0].Type != "rabbitmq" {
			t.Fatalf("want one rabbitmq trigger")
		}
		tr := spec.Triggers[0]
		queue := cm.Data["KLAXON_QUEUE"]
		if queue == "" {
			queue = "notifier"
		}
		if tr.Metadata["queueName"] != queue || tr.Metadata["mode"] != "QueueLength" {
			t.Errorf("trigger watches %q in mode %q, want KLAXON_QUEUE %q, QueueLength", tr.Metadata["queueName"], tr.Metadata["mode"], queue)
		}
		if tr.AuthenticationRef.Name != ta.Metadata.Name {
			t.Errorf("trigger authenticates with %q, not TriggerAuthentication %q", tr.AuthenticationRef.Name, ta.Metadata.Name)
		}
		var auth struct {
			SecretTargetRef []struct {
				Parameter string `yaml:"parameter"`
				Name      string `yaml:"name"`
				Key       string `yaml:"key"`
			} `yaml:"secretTargetRef"`
		}
		decodeSpec(t, ta, &auth)
		if len(auth.SecretTargetRef) != 1 {
			t.Fatal("want one secretTargetRef")
		}
		ref := auth.SecretTargetRef[0]
		if ref.Parameter != "host" || ref.Name != secret.Metadata.Name || ref.Key != "KLAXON_AMQP_URL" {
			t.Errorf("TriggerAuthentication takes %s from %s/%s, want host from %s/KLAXON_AMQP_URL", ref.Parameter, ref.Name, ref.Key, secret.Metadata.Name)
		}
	})

	t.Run("Kustomization", func(t *testing.T) {
		for _, k := range m["Kustomization"] {
			dir := filepath.Dir(k.file)
			for _, r := range k.Resources {
				if _, err := os.Stat(filepath.Join(dir, r)); err != nil {
					t.Errorf("%s lists %s: %v", k.file, r, err)
				}
			}
			if dir != "k8s" {
				continue
			}
			// The base lists every manifest beside it.
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if !e.IsDir() && e.Name() != "kustomization.yaml" && strings.HasSuffix(e.Name(), ".yaml") && !slices.Contains(k.Resources, e.Name()) {
					t.Errorf("%s does not list %s", k.file, e.Name())
				}
			}
		}
	})
}
