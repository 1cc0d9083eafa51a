package ps

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal/terminaltest"
)

func result() *reading.Reading {
	return &reading.Reading{
		Snapshot: &gpu.Snapshot{Devices: []gpu.Device{
			{Index: 1, UUID: "GPU-b", Processes: []gpu.Process{
				{PID: 30, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(3 << 20), MIG: true, GPUInstance: 1, ComputeInstance: 0},
			}},
			{Index: 0, UUID: "GPU-a", Processes: []gpu.Process{
				{PID: 20, Name: "smi-name", Type: gpu.ProcessMPS, UsedMemoryBytes: gpu.Known(2 << 20), SMUtilizationRatio: gpu.Known(0.5)},
				{PID: 10, Type: gpu.ProcessGraphics},
			}},
		}},
		Owners: map[uint32]attribution.Owner{
			20: {Name: "python3", Identity: attribution.Identity{Namespace: "ml", Pod: "train-0", Container: "main",
				PodUID: "u", ContainerID: strings.Repeat("a", 64), Runtime: "containerd"}},
			30: {Name: "job", Identity: attribution.Identity{SlurmJobID: "42"}},
		},
	}
}

func TestJSONFollowsReference(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, Rows(result())); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	// Sorted by GPU, then PID.
	for i, want := range []float64{10, 20, 30} {
		if rows[i]["pid"] != want {
			t.Errorf("row %d pid = %v, want %v", i, rows[i]["pid"], want)
		}
	}
	unknown := rows[0]
	if unknown["memory_used_bytes"] != nil || unknown["sm_utilization_ratio"] != nil || unknown["process_name"] != "" {
		t.Errorf("unknown values must be null and names empty: %v", unknown)
	}
	pod := rows[1]
	for k, want := range map[string]any{"gpu": 0.0, "uuid": "GPU-a", "process_name": "python3", "process_type": "mps",
		"memory_used_bytes": float64(2 << 20), "sm_utilization_ratio": 0.5, "namespace": "ml", "pod": "train-0",
		"container": "main", "pod_uid": "u", "runtime": "containerd", "slurm_job_id": "", "systemd_unit": ""} {
		if pod[k] != want {
			t.Errorf("%s = %v, want %v", k, pod[k], want)
		}
	}
	if rows[2]["gpu_instance"] != 1.0 || rows[2]["slurm_job_id"] != "42" {
		t.Errorf("MIG Slurm row = %v", rows[2])
	}
}

// The table speaks top's format: MIG as GPU:GI/CI, memory as MiB or GiB; TYPE and CONTAINER ID only when wide, USER
// only when users are looked up.
func TestTable(t *testing.T) {
	r := result()
	table := func(r *reading.Reading, t2 Table) string {
		var buf bytes.Buffer
		if err := WriteTable(&buf, r.Snapshot, Rows(r), t2); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	out := table(r, Table{Headers: true})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 || !regexp.MustCompile(`^GPU +PID +PROCESS +MEMORY +SM +OWNER$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^0 +20 +python3 +2 MiB +50% +pod ml/train-0/main$`).MatchString(lines[2]) ||
		!regexp.MustCompile(`^1:1/0 +30 +job +3 MiB +- +slurm job 42$`).MatchString(lines[3]) {
		t.Errorf("default table:\n%s", out)
	}
	if strings.Contains(out, "simulated") {
		t.Error("a real snapshot's table says simulated")
	}
	out = table(r, Table{Headers: true, Wide: true})
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !regexp.MustCompile(`^GPU +PID +TYPE +PROCESS +MEMORY +SM +OWNER +CONTAINER ID$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^0 +20 +mps +python3 +2 MiB +50% +pod ml/train-0/main +aaaaaaaaaaaa$`).MatchString(lines[2]) {
		t.Errorf("wide table:\n%s", out)
	}
	o := r.Owners[20]
	o.Identity.User = "alice"
	r.Owners[20] = o
	out = table(r, Table{Headers: true})
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !regexp.MustCompile(`^GPU +PID +USER +PROCESS`).MatchString(lines[0]) || !regexp.MustCompile(`^0 +20 +alice +python3 `).MatchString(lines[2]) ||
		!regexp.MustCompile(`^0 +10 +- +- `).MatchString(lines[1]) {
		t.Errorf("table with users:\n%s", out)
	}
}

// The cells ps and top share.
func TestCells(t *testing.T) {
	for v, want := range map[gpu.Value]string{
		{}: "-", gpu.Known(512 << 20): "512 MiB", gpu.Known(22.5 * (1 << 30)): "22.5 GiB",
	} {
		if got := Memory(v); got != want {
			t.Errorf("Memory(%v) = %q, want %q", v, got, want)
		}
	}
	if got := Percent(gpu.Value{}) + " " + Percent(gpu.Known(1.35)); got != "- 135%" {
		t.Errorf("Percent: %q", got)
	}
	gi, ci := 1, 0
	if got := GPUColumn(2, &gi, &ci) + " " + GPUColumn(3, nil, nil); got != "2:1/0 3" {
		t.Errorf("GPUColumn: %q", got)
	}
	if got := Plural(1, "GPU") + ", " + Plural(8, "GPU") + ", " + Plural(1, "process") + ", " + Plural(0, "process"); got != "1 GPU, 8 GPUs, 1 process, 0 processes" {
		t.Errorf("Plural: %q", got)
	}
}

// A filter that leaves nothing says so, and says what it was; a node without processes says that instead.
func TestFilterEmpty(t *testing.T) {
	if got := (Filter{Namespace: "ml", Owner: "x"}).Empty(14); got != "no GPU process matches --namespace=ml --owner=x (14 processes in all)" {
		t.Errorf("Empty: %q", got)
	}
	if got := (Filter{Owner: "x"}).Empty(0); got != "no GPU processes" {
		t.Errorf("Empty(0): %q", got)
	}
}

// Under --watch, JSON is one line per reading with its time.
func TestJSONLine(t *testing.T) {
	var buf bytes.Buffer
	at := time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.FixedZone("CET", 3600))
	if err := WriteJSONLine(&buf, at, Rows(result())); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSONLine(&buf, at.Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	var first struct {
		Time      time.Time        `json:"time"`
		Processes []map[string]any `json:"processes"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || !first.Time.Equal(at) || len(first.Processes) != 3 ||
		first.Processes[1]["memory_used_bytes"] != float64(2<<20) {
		t.Errorf("first line %s: %v", lines[0], err)
	}
	if !strings.HasPrefix(lines[0], `{"time":"2026-12-01T09:00:00.123Z","processes":[{"gpu":0,`) {
		t.Errorf("first line: %s", lines[0])
	}
	if lines[1] != `{"time":"2026-12-01T09:00:01.123Z","processes":[]}` {
		t.Errorf("a reading without processes: %s", lines[1])
	}
}

func TestFilter(t *testing.T) {
	rows := Rows(result())
	for _, c := range []struct {
		f    Filter
		pids string
	}{
		{Filter{}, "[10 20 30]"},
		{Filter{Namespace: "ml"}, "[20]"},
		{Filter{Namespace: "m"}, "[]"}, // a namespace is matched whole
		{Filter{Owner: "TRAIN-0"}, "[20]"},
		{Filter{Owner: "slurm job"}, "[30]"},
		{Filter{Namespace: "ml", Owner: "slurm"}, "[]"},
	} {
		var pids []uint32
		for _, r := range c.f.Keep(rows) {
			pids = append(pids, r.PID)
		}
		if got := fmt.Sprint(pids); got != c.pids {
			t.Errorf("%+v keeps %s, want %s", c.f, got, c.pids)
		}
	}
}

func TestTableWithoutHeaders(t *testing.T) {
	var buf bytes.Buffer
	r := result()
	r.Snapshot.Simulated = true
	if err := WriteTable(&buf, r.Snapshot, Rows(r), Table{}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "0 ") {
		t.Errorf("want the three rows alone:\n%s", buf.String())
	}
}

// Each JSON object has the process's keys, then the identity labels that docs/reference.md lists for ps, in that
// order, the user last; the identity's other values (QoS, pod labels) are not keys.
func TestJSONKeys(t *testing.T) {
	r := result()
	o := r.Owners[20]
	o.Identity.QoS, o.Identity.User, o.Identity.PodLabels = "burstable", "alice", map[string]string{"app": "x"}
	r.Owners[20] = o
	var buf bytes.Buffer
	if err := WriteJSON(&buf, Rows(r)); err != nil {
		t.Fatal(err)
	}
	var rows []json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(rows[1]))
	var keys []string
	for depth := 0; ; {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch tok {
		case json.Delim('{'):
			depth++
		case json.Delim('}'):
			depth--
		default:
			if s, ok := tok.(string); ok && depth == 1 && dec.More() {
				keys = append(keys, s)
				if _, err := dec.Token(); err != nil { // the value
					t.Fatal(err)
				}
			}
		}
	}
	want := "gpu uuid pid process_name process_type memory_used_bytes sm_utilization_ratio gpu_instance compute_instance " +
		"namespace pod container pod_uid container_id runtime slurm_job_id systemd_unit user"
	if got := strings.Join(keys, " "); got != want {
		t.Errorf("keys:\n  %s\nwant\n  %s", got, want)
	}
}

// Names come from whoever runs the workload: a process name (its comm), a cgroup directory (a systemd unit under a
// user manager), a runtime's container name. Printed, each is one row of one line that acts on nothing; as JSON it
// is kept exactly.
func TestTableEscapesNames(t *testing.T) {
	for _, a := range terminaltest.Attacks {
		t.Run(a.Name, func(t *testing.T) {
			r := &reading.Reading{
				Snapshot: &gpu.Snapshot{
					Devices: []gpu.Device{{Index: 0, UUID: "GPU-a", Processes: []gpu.Process{
						{PID: 10, Type: gpu.ProcessCompute}, {PID: 11, Type: gpu.ProcessCompute}, {PID: 12, Type: gpu.ProcessCompute},
						{PID: 13, Type: gpu.ProcessCompute},
					}}},
					Errors: []gpu.DeviceError{{Index: 0, Operation: "power", Err: errors.New("driver said " + a.Text)}},
				},
				Owners: map[uint32]attribution.Owner{
					10: {Name: a.Text},
					11: {Name: "sleep", Identity: attribution.Identity{SystemdUnit: "run-" + a.Text + ".scope"}},
					12: {Name: "python3", Identity: attribution.Identity{Namespace: "ml", Pod: "p", Container: a.Text, ContainerID: a.Text}},
					13: {Name: "after"},
				},
			}
			var buf bytes.Buffer
			if err := WriteTable(&buf, r.Snapshot, Rows(r), Table{Wide: true}); err != nil {
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

			buf.Reset()
			if err := WriteWarnings(&buf, r.Snapshot); err != nil {
				t.Fatal(err)
			}
			terminaltest.Shown(t, buf.String(), false)
			if want := "warning: GPU 0: power: driver said " + a.Escaped + "\n"; buf.String() != want {
				t.Errorf("warnings: %q, want %q", buf.String(), want)
			}

			buf.Reset()
			if err := WriteJSON(&buf, Rows(r)); err != nil {
				t.Fatal(err)
			}
			var rows []Row
			if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(a.Text) {
				return // JSON has no way to carry invalid UTF-8
			}
			if rows[0].ProcessName != a.Text {
				t.Errorf("JSON process_name = %q, want %q", rows[0].ProcessName, a.Text)
			}
		})
	}
}

// WriteJSON writes what json.Encoder writes for the whole array, a row at a time.
func TestWriteJSONIsTheEncoders(t *testing.T) {
	rows := Rows(result())
	odd := rows[0]
	odd.Node, odd.ProcessName, odd.Pod = "gpu-<a>&b", "é \"quoted\" \u2028", "p\x7f"
	for _, rs := range [][]Row{nil, {}, rows[:1], rows, append(append([]Row{}, rows...), odd)} {
		var want, got bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rs); err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			want.Reset()
			want.WriteString("[]\n") // an empty or nil slice: ps always prints an array
		}
		if err := WriteJSON(&got, rs); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("%d rows:\n%s\nwant\n%s", len(rs), got.String(), want.String())
		}
	}
}
