// Package fake is a kubelet PodResources v1 server for tests: the real gRPC service on a unix socket, answering
// with fixture allocations that the test sets and changes.
package fake

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Device is the devices of one resource allocated to one container: by a device plugin (Resource is the resource
// name, IDs the device IDs), or, when Claim is set, through a DRA ResourceClaim (Resource is the driver name, IDs
// the device names).
type Device struct {
	Namespace, Pod, Container string
	Resource                  string
	IDs                       []string
	Claim                     *Claim
}

// Claim is a ResourceClaim as PodResources reports it.
type Claim struct {
	Name, Namespace, Pool string
	// UID, when set, names each device's CDI device the way NVIDIA's DRA driver does:
	// k8s.<driver>/claim=<UID>-<device name> (cmd/gpu-kubelet-plugin/cdi.go, GetClaimDeviceName).
	UID string
}

// Server serves PodResources v1 on a unix socket.
type Server struct {
	podresources.UnimplementedPodResourcesListerServer

	path string
	srv  *grpc.Server

	mu          sync.Mutex
	devices     []Device
	allocatable map[string][]string
	listCalls   atomic.Int64
}

// Start listens on the socket path and serves devices (as List) and allocatable (resource → device IDs, as
// GetAllocatableResources) until Stop.
func Start(path string, devices []Device, allocatable map[string][]string) (*Server, error) {
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	s := &Server{path: path, srv: grpc.NewServer(), devices: devices, allocatable: allocatable}
	podresources.RegisterPodResourcesListerServer(s.srv, s)
	go s.srv.Serve(l)
	return s, nil
}

// Set replaces the allocations that List answers.
func (s *Server) Set(devices []Device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.devices = devices
}

// ListCalls is how many List calls were answered.
func (s *Server) ListCalls() int64 { return s.listCalls.Load() }

// Stop stops serving and removes the socket, as a kubelet that goes away does.
func (s *Server) Stop() {
	s.srv.Stop()
	os.Remove(s.path)
}

// List implements the PodResources v1 List call: pods in order of first appearance, their containers, devices and
// dynamic resources.
func (s *Server) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	s.listCalls.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &podresources.ListPodResourcesResponse{}
	pods := make(map[[2]string]*podresources.PodResources)
	for _, d := range s.devices {
		key := [2]string{d.Namespace, d.Pod}
		pod, ok := pods[key]
		if !ok {
			pod = &podresources.PodResources{Namespace: d.Namespace, Name: d.Pod}
			pods[key] = pod
			resp.PodResources = append(resp.PodResources, pod)
		}
		var ctr *podresources.ContainerResources
		for _, c := range pod.Containers {
			if c.Name == d.Container {
				ctr = c
			}
		}
		if ctr == nil {
			ctr = &podresources.ContainerResources{Name: d.Container}
			pod.Containers = append(pod.Containers, ctr)
		}
		if d.Claim == nil {
			ctr.Devices = append(ctr.Devices, &podresources.ContainerDevices{ResourceName: d.Resource, DeviceIds: d.IDs})
			continue
		}
		dr := &podresources.DynamicResource{ClaimName: d.Claim.Name, ClaimNamespace: d.Claim.Namespace}
		for _, id := range d.IDs {
			res := &podresources.ClaimResource{DriverName: d.Resource, PoolName: d.Claim.Pool, DeviceName: id}
			if d.Claim.UID != "" {
				res.CdiDevices = []*podresources.CDIDevice{{Name: "k8s." + d.Resource + "/claim=" + d.Claim.UID + "-" + id}}
			}
			dr.ClaimResources = append(dr.ClaimResources, res)
		}
		ctr.DynamicResources = append(ctr.DynamicResources, dr)
	}
	return resp, nil
}

// GetAllocatableResources implements the PodResources v1 call. Like the kubelet's, it reports device plugin
// resources only: DRA devices are published in ResourceSlices, not here.
func (s *Server) GetAllocatableResources(context.Context, *podresources.AllocatableResourcesRequest) (*podresources.AllocatableResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &podresources.AllocatableResourcesResponse{}
	for r, ids := range s.allocatable {
		resp.Devices = append(resp.Devices, &podresources.ContainerDevices{ResourceName: r, DeviceIds: ids})
	}
	return resp, nil
}
