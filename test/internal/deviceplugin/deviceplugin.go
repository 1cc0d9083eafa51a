// Package deviceplugin is a fake NVIDIA device plugin for the Kubernetes end-to-end test: it speaks the kubelet's
// real device-plugin API (v1beta1), registers a resource such as nvidia.com/gpu, and advertises the simulated
// node's GPUs by UUID, and time-slicing replicas as UUID::N as NVIDIA's plugin names them, so that a real kubelet
// allocates them to pods and reports the allocation through its PodResources API.
package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin is a running fake device plugin.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	devices  []string
	socket   string
	server   *grpc.Server

	mu          sync.Mutex
	allocations [][]string // the device IDs of each container the kubelet asked Allocate for
}

// Replicas returns the device IDs of a GPU shared by time-slicing: UUID::0 ... UUID::n-1.
func Replicas(uuid string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s::%d", uuid, i)
	}
	return ids
}

// Start serves the plugin on a socket in dir (the kubelet's device-plugins directory, which holds its
// registration socket kubelet.sock) and registers resource with the kubelet. Stop ends it.
func Start(ctx context.Context, dir, resource string, devices []string) (*Plugin, error) {
	p := &Plugin{
		resource: resource,
		devices:  devices,
		socket:   filepath.Join(dir, "gpe-fake-"+strings.NewReplacer("/", "-", ".", "-").Replace(resource)+".sock"),
		server:   grpc.NewServer(),
	}
	if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, fmt.Errorf("device plugin: listening on %s: %w", p.socket, err)
	}
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go p.server.Serve(l)

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	}); err != nil {
		p.Stop()
		return nil, fmt.Errorf("device plugin: registering %s with the kubelet: %w", resource, err)
	}
	return p, nil
}

// Stop ends the plugin's server and removes its socket.
func (p *Plugin) Stop() {
	p.server.Stop()
	os.Remove(p.socket)
}

// Allocations returns the device IDs of every container the kubelet has asked the plugin to allocate, each sorted.
func (p *Plugin) Allocations() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]string(nil), p.allocations...)
}

func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices, all healthy, once, and keeps the stream open: the kubelet takes a closed stream
// for a plugin that is gone and marks its devices unhealthy.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range p.devices {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := s.Send(resp); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// Allocate answers like NVIDIA's plugin with its default envvar strategy: NVIDIA_VISIBLE_DEVICES lists the
// GPUs' UUIDs (a replica UUID::N is its GPU's UUID).
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		ids := append([]string(nil), c.DevicesIds...)
		sort.Strings(ids)
		p.mu.Lock()
		p.allocations = append(p.allocations, ids)
		p.mu.Unlock()
		var uuids []string
		seen := map[string]bool{}
		for _, id := range ids {
			uuid, _, _ := strings.Cut(id, "::")
			if !seen[uuid] {
				seen[uuid] = true
				uuids = append(uuids, uuid)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(uuids, ",")},
		})
	}
	return resp, nil
}

func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
