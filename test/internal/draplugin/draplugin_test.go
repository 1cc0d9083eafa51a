package draplugin

import (
	"context"
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// test/k8s runs the plugin against a real kubelet, API server and scheduler; this checks what it publishes and
// prepares on its own.

var testConfig = Config{NodeName: "node-a", DriverVersion: "580.95.5", CUDAVersion: "13.0.0", GPUs: []GPU{
	{Minor: 0, UUID: "GPU-00000000-0000-0000-0000-000000000001", ProductName: "NVIDIA H100 80GB HBM3", MemoryBytes: 85520809984, PCIBusID: "00000000:1C:00.0"},
	{Minor: 3, UUID: "GPU-00000000-0000-0000-0000-000000000002", ProductName: "NVIDIA H100 80GB HBM3", MemoryBytes: 85520809984, PCIBusID: "00000000:1D:00.0"},
}}

func TestResources(t *testing.T) {
	p := &Plugin{cfg: testConfig}
	res := p.resources()
	pool, ok := res.Pools["node-a"]
	if len(res.Pools) != 1 || !ok || len(pool.Slices) != 1 {
		t.Fatalf("pools %+v, want one pool named after the node with one slice", res.Pools)
	}
	devs := pool.Slices[0].Devices
	if len(devs) != 2 || devs[0].Name != "gpu-0" || devs[1].Name != "gpu-3" {
		t.Fatalf("devices %+v, want gpu-0 and gpu-3 (named by minor number)", devs)
	}
	a := devs[1].Attributes
	if *a["type"].StringValue != "gpu" || *a["uuid"].StringValue != testConfig.GPUs[1].UUID ||
		*a["driverVersion"].VersionValue != "580.95.5" || *a["pcieBusID"].StringValue != "00000000:1D:00.0" {
		t.Errorf("gpu-3's attributes %+v", a)
	}
	if m := devs[0].Capacity["memory"].Value; m.Value() != 85520809984 {
		t.Errorf("gpu-0's memory capacity %s", m.String())
	}
}

func claim(uid, name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: name, Namespace: "ns"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results}}},
	}
}

func TestPrepare(t *testing.T) {
	p := &Plugin{cfg: testConfig, prepared: map[types.UID]Prepared{}}
	got, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{
		claim("a", "mine",
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DriverName, Pool: "node-a", Device: "gpu-3"},
			resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "dra.net", Pool: "node-a", Device: "eth1"}),
		claim("b", "unknown-device",
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DriverName, Pool: "node-a", Device: "gpu-1"}),
		claim("c", "other-pool",
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: DriverName, Pool: "node-b", Device: "gpu-0"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []kubeletplugin.Device{{Requests: []string{"gpu"}, PoolName: "node-a", DeviceName: "gpu-3"}}
	if r := got["a"]; r.Err != nil || !reflect.DeepEqual(r.Devices, want) {
		t.Errorf("claim mine: %+v, want devices %+v and no CDI device (other drivers' devices left out)", r, want)
	}
	for _, uid := range []types.UID{"b", "c"} {
		if got[uid].Err == nil {
			t.Errorf("claim %s: prepared %+v, want an error for a device the plugin does not publish", uid, got[uid])
		}
	}
	if got, want := p.Prepared(), []Prepared{{Namespace: "ns", Name: "mine", Devices: []string{"gpu-3"}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Prepared() = %+v, want %+v", got, want)
	}

	out, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{
		{UID: "a"}, {UID: "never-prepared"}})
	if err != nil || len(out) != 2 || out["a"] != nil || out["never-prepared"] != nil {
		t.Errorf("UnprepareResourceClaims = %v, %v; want no error for either claim", out, err)
	}
	if got := p.Prepared(); len(got) != 0 {
		t.Errorf("Prepared() after unprepare = %+v", got)
	}
}
