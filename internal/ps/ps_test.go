package ps

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal/terminaltest"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

func reading() *view.Reading {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	return &view.Reading{Time: at, Processes: []view.Process{
		{GPU: 0, UUID: "GPU-a", PID: 10, Type: gpu.ProcessGraphics},
		{GPU: 0, UUID: "GPU-a", PID: 20, Name: "python3", Type: gpu.ProcessMPS, Memory: gpu.Known(2 << 20),
			SM: gpu.Known(0.5), Started: at.Add(-3 * time.Hour),
			Identity: attribution.Identity{Namespace: "ml", Pod: "train-0", Container: "main", PodUID: "u",
				ContainerID: strings.Repeat("a", 64), Runtime: "containerd", QoS: "burstable", PodLabels: map[string]string{"app": "x"}}},
		{GPU: 1, UUID: "GPU-b", PID: 30, Name: "job", Type: gpu.ProcessCompute, Memory: gpu.Known(581.1 * (1 << 30)),
			MIG: true, GPUInstance: 1, ComputeInstance: 0, Identity: attribution.Identity{SlurmJobID: "42"}},
	}}
}

func jsonOf(t *testing.T, procs []view.Process) string {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteJSON(&buf, procs); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// Each JSON object has the process's keys, then the identity labels that docs/reference.md lists for ps, in that
// order, the user last; unknown numbers are null, and the identity's other values (QoS, pod labels) are not keys.
func TestJSONFollowsReference(t *testing.T) {
	out := jsonOf(t, reading().Processes)
	var rows []json.RawMessage
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("%v:\n%s", err, out)
	}
	if got := keys(t, rows[1]); got != "gpu uuid pid process_name process_type memory_used_bytes sm_utilization_ratio "+
		"gpu_instance compute_instance namespace pod container pod_uid container_id runtime slurm_job_id systemd_unit user" {
		t.Errorf("keys: %s", got)
	}
	var first, mig map[string]any
	json.Unmarshal(rows[0], &first)
	json.Unmarshal(rows[2], &mig)
	if first["memory_used_bytes"] != nil || first["sm_utilization_ratio"] != nil || first["gpu_instance"] != nil || first["process_name"] != "" {
		t.Errorf("unknown values must be null and names empty: %v", first)
	}
	if mig["gpu_instance"] != 1.0 || mig["compute_instance"] != 0.0 || mig["slurm_job_id"] != "42" {
		t.Errorf("MIG row: %v", mig)
	}
	// Indented as json.Encoder indents an array, a row at a time.
	if !strings.HasPrefix(out, "[\n  {\n    \"gpu\": 0,\n") || !strings.HasSuffix(out, "\n  }\n]\n") || jsonOf(t, nil) != "[]\n" {
		t.Errorf("layout:\n%s", out)
	}
}

func keys(t *testing.T, obj []byte) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.Token()
	var ks []string
	for dec.More() {
		k, _ := dec.Token()
		ks = append(ks, k.(string))
		var skip json.RawMessage
		dec.Decode(&skip)
	}
	return strings.Join(ks, " ")
}

// --watch -o json is JSON Lines of the same row objects, each with its reading's time first.
func TestJSONLines(t *testing.T) {
	r := reading()
	var buf bytes.Buffer
	if err := WriteJSONLines(&buf, r.Time, r.Processes); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	var rows []map[string]any
	json.Unmarshal([]byte(jsonOf(t, r.Processes)), &rows)
	if len(lines) != 3 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	for i, l := range lines {
		var row map[string]any
		if err := json.Unmarshal([]byte(l), &row); err != nil || !strings.HasPrefix(l, `{"time":"2026-12-07T10:00:00Z","gpu":`) {
			t.Fatalf("line %d (%v): %s", i, err, l)
		}
		delete(row, "time")
		a, _ := json.Marshal(row)
		b, _ := json.Marshal(rows[i])
		if !bytes.Equal(a, b) {
			t.Errorf("line %d is not -o json's row:\n%s\n%s", i, a, b)
		}
	}
}

// The table speaks top's format: MIG as GPU:GI/CI, memory in its 8 columns; wide adds TYPE, AGE and CONTAINER ID,
// USER shows only when users are looked up, and NODE only for a cluster.
func TestTable(t *testing.T) {
	r := reading()
	table := func(format string, headers bool) []string {
		f, err := ParseFormat(format)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := WriteTable(&buf, r, r.Processes, f, headers); err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	}
	lines := table("table", true)
	if len(lines) != 4 || !regexp.MustCompile(`^GPU +PID +PROCESS +MEMORY +SM +OWNER$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^0 +20 +python3 +2 MiB +50% +pod ml/train-0/main$`).MatchString(lines[2]) ||
		!regexp.MustCompile(`^1:1/0 +30 +job +581 GiB +- +slurm job 42$`).MatchString(lines[3]) {
		t.Errorf("default table:\n%s", strings.Join(lines, "\n"))
	}
	lines = table("wide", true)
	if !regexp.MustCompile(`^GPU +PID +TYPE +PROCESS +MEMORY +SM +AGE +OWNER +CONTAINER ID$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^0 +20 +mps +python3 +2 MiB +50% +3h +pod ml/train-0/main +aaaaaaaaaaaa$`).MatchString(lines[2]) {
		t.Errorf("wide table:\n%s", strings.Join(lines, "\n"))
	}
	r.Processes[1].Identity.User = "alice"
	r.Cluster = true
	for i := range r.Processes {
		r.Processes[i].Node = "gpu-a"
	}
	lines = table("table", false)
	if len(lines) != 3 || !regexp.MustCompile(`^gpu-a +0 +20 +alice +python3 `).MatchString(lines[1]) ||
		!regexp.MustCompile(`^gpu-a +0 +10 +- +- `).MatchString(lines[0]) {
		t.Errorf("a cluster's table with users, without headers:\n%s", strings.Join(lines, "\n"))
	}
}

// custom-columns names its columns and their keys, as kubectl's does: JSON keys, identity labels and the table's
// cells; what is not known is <none>.
func TestCustomColumns(t *testing.T) {
	r := reading()
	f, err := ParseFormat("custom-columns=PID:pid,POD:.pod,BYTES:memory_used_bytes,MEM:memory,OWNER:owner,GI:gpu_instance")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, r, r.Processes, f, true); err != nil {
		t.Fatal(err)
	}
	want := "PID  POD      BYTES         MEM      OWNER                GI\n" +
		"10   -        <none>        -        -                    <none>\n" +
		"20   train-0  2097152       2 MiB    pod ml/train-0/main  <none>\n" +
		"30   -        623951373926  581 GiB  slurm job 42         1\n"
	if buf.String() != want {
		t.Errorf("custom columns:\n%s\nwant\n%s", buf.String(), want)
	}
	for _, bad := range []string{"custom-columns=", "custom-columns=PID", "custom-columns=X:nope", "yaml"} {
		if _, err := ParseFormat(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// Names come from whoever runs the workload: a process name (its comm), a cgroup directory (a systemd unit under a
// user manager), a runtime's container name. In the table each is one row of one line that acts on nothing. In
// JSON it is exact, and what a terminal would act on (C1 controls, bidirectional overrides, zero-width
// characters) is a \u escape, so that JSON printed on a terminal is as safe as the table.
func TestNamesAreEscaped(t *testing.T) {
	for _, a := range terminaltest.Attacks {
		t.Run(a.Name, func(t *testing.T) {
			r := &view.Reading{Warnings: []string{"GPU 0: power: driver said " + a.Text}, Processes: []view.Process{
				{PID: 10, Name: a.Text},
				{PID: 11, Name: "sleep", Identity: attribution.Identity{SystemdUnit: "run-" + a.Text + ".scope"}},
				{PID: 12, Name: "python3", Identity: attribution.Identity{Namespace: "ml", Pod: "p", Container: a.Text, ContainerID: a.Text}},
				{PID: 13, Name: "after"},
			}}
			f, _ := ParseFormat("wide")
			var buf bytes.Buffer
			if err := WriteTable(&buf, r, r.Processes, f, false); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			terminaltest.Shown(t, out, false)
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 4 || !strings.HasPrefix(lines[3], "0  13 ") {
				t.Errorf("want 4 rows, the last PID 13:\n%s", out)
			}
			for _, want := range []string{" " + a.Escaped + " ", "service run-" + a.Escaped + ".scope", "pod ml/p/" + a.Escaped} {
				if !strings.Contains(out, want) {
					t.Errorf("table lacks %q:\n%s", want, out)
				}
			}
			notes := strings.Join(Notes(r), "\n")
			terminaltest.Shown(t, notes, false)
			if want := "warning: GPU 0: power: driver said " + a.Escaped; notes != want {
				t.Errorf("notes: %q, want %q", notes, want)
			}

			out = jsonOf(t, r.Processes)
			terminaltest.Shown(t, out, false)
			var rows []map[string]any
			if err := json.Unmarshal([]byte(out), &rows); err != nil {
				t.Fatal(err)
			}
			if utf8.ValidString(a.Text) && rows[0]["process_name"] != a.Text {
				t.Errorf("JSON process_name = %q, want %q", rows[0]["process_name"], a.Text)
			}
		})
	}
}

// The notes say what the rows do not, for stderr: a simulated node, each GPU's health problems, series read twice,
// values left out, nodes that cannot be trusted, and what could not be read.
func TestNotes(t *testing.T) {
	r := &view.Reading{Simulated: true, Duplicates: 15, Dropped: 2, Warnings: []string{"GPU 3: processes: not supported"},
		Nodes: []view.Node{{Name: "gpu-a"}, {Name: "gpu-c", State: view.NodeDown, LastSeen: true, Age: 40 * time.Second}}}
	g := view.GPU{Node: "gpu-a", Index: 6, Health: []string{"needs GPU reset", "XID 48"}, Severity: view.Fault}
	s, _ := view.HealthSignal(&g)
	r.Signals = []view.Signal{s}
	want := "# simulated GPU data (--demo or --gpu.simulated-config)\n" +
		"# GPU 6 of gpu-a: needs GPU reset, XID 48\n" +
		"# 15 series read twice (a node scraped by two jobs): each is shown once\n" +
		"# 2 values left out as unknown: not a number, infinite or out of range\n" +
		"warning: node gpu-c: stale: exporter down, last reading 40s ago\n" +
		"warning: GPU 3: processes: not supported"
	if got := strings.Join(Notes(r), "\n"); got != want {
		t.Errorf("notes:\n%s\nwant\n%s", got, want)
	}
}
