package cluster

import (
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
)

// Every family the view reads is one the exporter writes, with every label the view reads of it: a family or a
// label renamed in the exporter fails here, not only in the end-to-end suite against a real Prometheus.
func TestFamiliesAreTheExportersFamilies(t *testing.T) {
	demo := simulated.Demo()
	a := attribution.New(attribution.Config{Preset: demo, Users: noUsers{}})
	reader := reading.New(demo, a, 5*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g := collector.New(reader, collector.Options{Processes: true, ProcessUser: true, Allocations: demo})
	g.Registerer().MustRegister(versioncollector.NewCollector("gpu_pod_exporter"))
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	written := make(map[string][]string) // family → its labels
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(written[mf.GetName()], l.GetName()) {
					written[mf.GetName()] = append(written[mf.GetName()], l.GetName())
				}
			}
		}
		if _, ok := written[mf.GetName()]; !ok {
			written[mf.GetName()] = nil
		}
	}
	// Device families that no simulated node fills (retired pages are NVML's and nvidia-smi's), from their table.
	for _, f := range collector.DeviceFamilies() {
		if _, ok := written[f.Name]; !ok {
			written[f.Name] = append([]string{"gpu", "uuid"}, f.Labels...)
		}
	}
	for _, f := range familiesRead {
		labels, ok := written[f.Name]
		if !ok {
			t.Errorf("the view reads %s, which the exporter does not write", f.Name)
			continue
		}
		for _, l := range f.labels {
			if !slices.Contains(labels, l) {
				t.Errorf("the view reads %s's label %s, which the exporter does not write (it writes %v)", f.Name, l, labels)
			}
		}
	}
	// And every family a query names is in the table.
	name := regexp.MustCompile(`\b(gpu_[a-z_]+)\b`)
	grouping := regexp.MustCompile(`(by|on|ignoring) \([^)]*\)`) // labels, such as gpu_instance
	for i := range nQueries {
		for _, m := range name.FindAllString(grouping.ReplaceAllString(New(nil, Config{}).Expr(i), ""), -1) {
			if _, ok := familyNamed(m); !ok {
				t.Errorf("%s reads %s, which is not in the table of families", queries[i].name, m)
			}
		}
	}
	if !strings.HasPrefix(buildInfo.Name, "gpu_pod_exporter_") {
		t.Errorf("build info: %s", buildInfo.Name)
	}
}

type noUsers struct{}

func (noUsers) User(uint32) (string, error) { return "", io.EOF }

// The view drops what the exporter leaves out, and nothing else: each device family it reads has the range the
// exporter bounds its series by, one table's (internal/families).
func TestTheViewAndTheExporterBoundValuesAlike(t *testing.T) {
	exporter := map[string]collector.Family{}
	for _, f := range collector.DeviceFamilies() {
		exporter[f.Name] = f
	}
	n := 0
	for _, f := range familiesRead {
		e, ok := exporter[f.Name]
		if !ok {
			continue
		}
		n++
		if e.Range != f.Range {
			t.Errorf("%s: the view bounds it by %+v, the exporter by %+v", f.Name, f.Range, e.Range)
		}
	}
	if n < 20 {
		t.Errorf("only %d of the view's families are device families", n)
	}
}
