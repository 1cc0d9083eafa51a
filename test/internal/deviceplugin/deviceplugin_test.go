package deviceplugin

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// registry stands in for the kubelet's registration service; test/k8s runs the plugin against a real kubelet.
type registry struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (r *registry) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.got <- req
	return &pluginapi.Empty{}, nil
}

func TestPlugin(t *testing.T) {
	dir := t.TempDir()
	reg := &registry{got: make(chan *pluginapi.RegisterRequest, 1)}
	testkit.ServeGRPC(t, filepath.Join(dir, "kubelet.sock"), func(s *grpc.Server) { pluginapi.RegisterRegistrationServer(s, reg) })

	const gpu0, gpu1 = "GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"
	devices := append([]string{gpu0}, Replicas(gpu1, 2)...)
	p, err := Start(context.Background(), dir, "nvidia.com/gpu", devices)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	req := <-reg.got
	if req.Version != "v1beta1" || req.ResourceName != "nvidia.com/gpu" || req.Endpoint != filepath.Base(p.socket) {
		t.Errorf("registration %v", req)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s is %s", d.ID, d.Health)
		}
		ids = append(ids, d.ID)
	}
	if want := []string{gpu0, gpu1 + "::0", gpu1 + "::1"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("devices %v, want %v", ids, want)
	}

	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{gpu1 + "::1", gpu0}}, {DevicesIds: []string{gpu1 + "::0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var envs []string
	for _, r := range resp.ContainerResponses {
		envs = append(envs, r.Envs["NVIDIA_VISIBLE_DEVICES"])
	}
	if want := []string{gpu0 + "," + gpu1, gpu1}; !reflect.DeepEqual(envs, want) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want %q", envs, want)
	}
	if want := [][]string{{gpu0, gpu1 + "::1"}, {gpu1 + "::0"}}; !reflect.DeepEqual(p.Allocations(), want) {
		t.Errorf("allocations %v, want %v", p.Allocations(), want)
	}
}
