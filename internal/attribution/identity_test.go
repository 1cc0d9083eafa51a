package attribution

import (
	"reflect"
	"testing"
)

// IdentityLabels is the one list of the identity's values: every string of Identity has one row, so that no output
// and not the UTF-8 repair can leave one out, and WorkloadKey holds the labels on workload series.
func TestIdentityLabelsCoverIdentity(t *testing.T) {
	rows := make(map[uintptr]string)
	names := make(map[string]bool)
	for _, l := range IdentityLabels {
		if other, ok := rows[l.field]; ok {
			t.Errorf("%s and %s read the same field", l.Name, other)
		}
		if names[l.Name] {
			t.Errorf("%s is listed twice", l.Name)
		}
		rows[l.field], names[l.Name] = l.Name, true
	}
	typ := reflect.TypeFor[Identity]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		_, listed := rows[f.Offset]
		switch {
		case f.Type.Kind() == reflect.String && !listed:
			t.Errorf("Identity.%s has no row in IdentityLabels", f.Name)
		case f.Type.Kind() != reflect.String && listed:
			t.Errorf("%s reads Identity.%s, which is not a string", rows[f.Offset], f.Name)
		}
		delete(rows, f.Offset)
	}
	for _, name := range rows {
		t.Errorf("%s reads no field of Identity", name)
	}
	if len(workloadLabels) != len(WorkloadKey{}) {
		t.Errorf("WorkloadKey has %d values for the %d labels on workload series", len(WorkloadKey{}), len(workloadLabels))
	}
}

// Get reads and sets the field its label names.
func TestIdentityLabelGet(t *testing.T) {
	id := Identity{Namespace: "ns", ContainerID: "c0ffee", User: "alice"}
	byName := make(map[string]*string)
	for _, l := range IdentityLabels {
		byName[l.Name] = l.Get(&id)
	}
	if *byName["namespace"] != "ns" || *byName["container_id"] != "c0ffee" || *byName["user"] != "alice" || *byName["pod"] != "" {
		t.Errorf("values read: namespace %q, container_id %q, user %q, pod %q", *byName["namespace"],
			*byName["container_id"], *byName["user"], *byName["pod"])
	}
	*byName["slurm_job_id"] = "42"
	if id.SlurmJobID != "42" {
		t.Errorf("setting slurm_job_id set %+v", id)
	}
}

// Identities that differ only in their container ID (a container restarted in its pod) are one workload; any other
// label on workload series tells workloads apart.
func TestWorkloadKey(t *testing.T) {
	base := Identity{Namespace: "ns", Pod: "p", Container: "c", ContainerID: "1", Runtime: "containerd", QoS: "burstable"}
	for _, l := range IdentityLabels {
		other := base
		*l.Get(&other) += "x"
		if same := other.Key() == base.Key(); same != (l.Use&OnWorkloads == 0) {
			t.Errorf("changing %s: same workload %v", l.Name, same)
		}
	}
}

// Reading an identity's labels costs no allocation: the series of every process and workload read them.
func TestIdentityLabelsDoNotAllocate(t *testing.T) {
	id := Identity{Namespace: "ns", Pod: "p"}
	var n int
	allocs := testing.AllocsPerRun(100, func() {
		k := id.Key()
		n += len(k[0])
		if !id.isValidUTF8() {
			t.Fatal("valid identity")
		}
	})
	if allocs != 0 {
		t.Errorf("%.0f allocations to read an identity's labels", allocs)
	}
}
