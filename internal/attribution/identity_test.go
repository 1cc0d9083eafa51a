package attribution

import (
	"reflect"
	"testing"
)

// IdentityLabels is the one list of the identity's values: every string of Identity has one row, so that no output
// and not the UTF-8 repair can leave one out, and WorkloadKey holds the labels on workload series.
func TestIdentityLabelsCoverIdentity(t *testing.T) {
	// Each string field of an identity gets its own name as value; each label must read exactly one of them.
	var id Identity
	v := reflect.ValueOf(&id).Elem()
	fields := make(map[string]bool)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.String {
			name := v.Type().Field(i).Name
			f.SetString(name)
			fields[name] = false
		}
	}
	names := make(map[string]bool)
	for _, l := range IdentityLabels {
		if names[l.Name] {
			t.Errorf("%s is listed twice", l.Name)
		}
		names[l.Name] = true
		field := *l.Get(&id)
		switch read, ok := fields[field]; {
		case !ok:
			t.Errorf("%s reads no string field of Identity", l.Name)
		case read:
			t.Errorf("%s reads Identity.%s, which another label reads too", l.Name, field)
		}
		fields[field] = true
	}
	for name, read := range fields {
		if !read {
			t.Errorf("Identity.%s has no row in IdentityLabels", name)
		}
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
