// Package deploy tests the deployment artifacts with the tools that consume them: helm (lint, template), the
// official Kubernetes and prometheus-operator Go types, systemd-analyze, and, with the e2e build tag, a real dockerd
// (the container image), a real Prometheus (the Grafana dashboard's queries) and promtool (rules, CloudWatch scrape
// configuration).
//
//	go test ./test/deploy                      the artifacts without root or daemons (scripts/tools.sh builds helm once)
//	go test ./test/deploy -update              rewrite the generated files: plain manifests, the chart's copies
//	go test -tags e2e ./test/deploy            also the image under dockerd and the dashboard against Prometheus
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

var update = flag.Bool("update", false, "rewrite deploy/kubernetes/*.yaml and the chart's copies of the dashboard and rules")

// kubeVersion is the Kubernetes version helm renders for: a go-installed helm defaults to v1.20, below the chart's
// kubeVersion constraint.
const kubeVersion = "1.33.0"

const chartDir = "deploy/helm/gpu-pod-exporter"

// repoRoot is the module root: the tests read and render the artifacts from there.
func repoRoot(testing.TB) string { return e2eutil.RepoRoot() }

func readRepoFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tool returns a release or deployment tool (e2eutil.Tool).
func tool(t testing.TB, name string) string {
	t.Helper()
	return e2eutil.Tool(t, name)
}

// helm returns the helm binary the tests share (e2eutil.Helm).
func helm(t testing.TB) string { return e2eutil.Helm(t) }

// run runs a command in the repository root and returns its stdout; a failure fails the test with its output.
func run(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	out, err := runErr(t, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(t testing.TB, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = repoRoot(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// splitDocs splits a multi-document YAML stream, dropping documents that hold only comments.
func splitDocs(stream []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), stream...), []byte("\n---")) {
		empty := true
		for _, line := range strings.Split(string(d), "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.HasPrefix(line, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

// strictYAML decodes YAML into v through JSON, rejecting fields that v's type does not have: the check that a
// misspelt Kubernetes or agent field fails, like the API server's strict field validation.
func strictYAML(doc []byte, v any) error {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	return strictJSON(j, v)
}

// strictJSON decodes JSON into v, rejecting unknown fields. encoding/json alone matches field names without regard
// to case (readOnlyRootFileSystem would pass for readOnlyRootFilesystem), so the names are also checked case-sensitively,
// with duplicate keys, by sigs.k8s.io/json: the decoder the Kubernetes API server uses for strict field validation.
func strictJSON(j []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	strict, err := sigsjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return errors.Join(strict...)
	}
	return nil
}
