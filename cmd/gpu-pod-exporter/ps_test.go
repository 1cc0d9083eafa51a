package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ps prints the narrow table by default and the wide one with -o wide, with the demo's users, and its notes on
// stderr, so that stdout is the table alone; a filter that matches nothing says so on stderr, and the output stays
// a table.
func TestPSTableAndEmptyFilter(t *testing.T) {
	out, stderr, code := runMain(t, "ps", "--demo")
	header := headerLine(out)
	if code != 0 || strings.Join(strings.Fields(header), " ") != "GPU PID USER PROCESS MEMORY SM OWNER" ||
		!strings.HasPrefix(out, "GPU ") || strings.Contains(out, "#") ||
		!strings.Contains(stderr, "# simulated GPU data") || !strings.Contains(stderr, "# GPU 6: needs GPU reset") {
		t.Errorf("ps --demo: exit %d, stderr %q, stdout\n%s", code, stderr, out)
	}
	if !strings.Contains(out, "\n2:1/0 ") || strings.Contains(out, "GI ") || !strings.Contains(out, " GiB ") {
		t.Errorf("ps --demo does not show MIG as GPU:GI/CI, or memory in GiB:\n%s", out)
	}
	out, _, code = runMain(t, "ps", "--demo", "-o", "wide")
	if header := headerLine(out); code != 0 || strings.Join(strings.Fields(header), " ") != "GPU PID USER TYPE PROCESS MEMORY SM AGE OWNER CONTAINER ID" {
		t.Errorf("ps -o wide: exit %d, header %q", code, header)
	}
	out, stderr, code = runMain(t, "ps", "--demo", "--owner=no-such-pod", "--no-headers")
	if code != 0 || out != "" || !strings.Contains(stderr, "\ngpu-pod-exporter ps: no GPU process matches --owner=no-such-pod (") {
		t.Errorf("a filter that matches nothing: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

func headerLine(table string) string {
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, "GPU ") {
			return l
		}
	}
	return ""
}

// ps -o json names memory as the metric does and carries the user; under --watch it writes JSON Lines, a line
// per process, the same object with its reading's time first.
func TestPSJSON(t *testing.T) {
	out, _, code := runMain(t, "ps", "--demo", "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) == 0 {
		t.Fatalf("ps -o json: exit %d, %v:\n%s", code, err, out)
	}
	if _, old := rows[0]["used_memory_bytes"]; old || rows[0]["memory_used_bytes"] == nil || rows[0]["user"] == "" || rows[0]["user"] == nil {
		t.Errorf("ps -o json row: %v", rows[0])
	}

	cmd := exec.Command(os.Args[0], "ps", "--demo", "-o", "json", "--watch", "--interval=100ms")
	cmd.Env = append(os.Environ(), "GPE_TEST_RUN_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 1<<20)
	var times []time.Time
	for n := 0; len(times) < 2 && lines.Scan(); n++ {
		var row map[string]any
		if err := json.Unmarshal(lines.Bytes(), &row); err != nil || !strings.HasPrefix(lines.Text(), `{"time":"`) {
			t.Fatalf("a --watch line is not a row with its time first (%v): %s", err, lines.Bytes())
		}
		at, err := time.Parse(time.RFC3339Nano, row["time"].(string))
		if err != nil {
			t.Fatal(err)
		}
		delete(row, "time")
		if want := rows[n%len(rows)]; fmt.Sprint(row) != fmt.Sprint(want) {
			t.Fatalf("--watch row %d:\n%v\nwant the -o json row\n%v", n, row, want)
		}
		if n%len(rows) == 0 {
			times = append(times, at)
		}
	}
	if len(times) != 2 || !times[1].After(times[0]) || times[1].Sub(times[0]) < 100*time.Millisecond {
		t.Errorf("--watch readings' times: %v (%v)", times, lines.Err())
	}
}

// top --sort takes mem, as its key help says: the biggest user of memory first.
func TestTopSortMem(t *testing.T) {
	out, stderr, code := runMain(t, "top", "--demo", "--sort=mem", "-n", "1")
	if code != 0 || stderr != "" {
		t.Fatalf("top --sort=mem: exit %d: %s", code, stderr)
	}
	var pids []string
	table := out[strings.Index(out, "\nGPU        PID")+1:]
	for _, l := range strings.Split(table, "\n")[1:] {
		if f := strings.Fields(l); len(f) > 1 {
			pids = append(pids, f[1])
		}
	}
	if len(pids) < 2 || pids[0] != "61001" || pids[len(pids)-1] != "2811" {
		t.Errorf("top --sort=mem: PIDs %v, want 61001 (60 GiB) first and 2811 (512 MiB) last:\n%s", pids, out)
	}
}

// --demo alone is the built-in node, before or after the command; --demo=NAME another node, or a vendor preset; a
// malformed name is a usage error that names the flag.
func TestDemoNames(t *testing.T) {
	out, _, code := runMain(t, "--demo", "ps", "--no-headers", "--gpu=4")
	a, _, _ := runMain(t, "ps", "--demo=node-a", "--no-headers", "--gpu=4")
	if code != 0 || out == "" || out != a {
		t.Errorf("--demo ps and ps --demo=node-a differ: %d\n%s\n%s", code, out, a)
	}
	b, _, code := runMain(t, "ps", "--demo=node-b", "--no-headers", "-o", "custom-columns=PID:pid,POD:pod")
	demo, _, _ := runMain(t, "ps", "--demo", "--no-headers", "-o", "custom-columns=PID:pid,POD:pod")
	if code != 0 || b == "" || strings.Count(b, "\n") != strings.Count(demo, "\n") || b == demo {
		t.Errorf("--demo=node-b: exit %d\n%s", code, b)
	}
	amd, _, code := runMain(t, "ps", "--demo=amd", "--no-headers")
	if code != 0 || !strings.Contains(amd, "pod llm/llama-pretrain-0/trainer") {
		t.Errorf("--demo=amd: exit %d\n%s", code, amd)
	}
	for _, name := range []string{"Node_B", "-x"} {
		_, stderr, code := runMain(t, "ps", "--demo="+name)
		if code != 2 || !strings.Contains(stderr, "--demo: ") {
			t.Errorf("--demo=%s: exit %d, %q", name, code, stderr)
		}
	}
}
