// Package draplugin is a fake kubelet plugin of NVIDIA's DRA driver for GPUs (gpu.nvidia.com) for the Kubernetes
// end-to-end test. It is built on the upstream helper, k8s.io/dynamic-resource-allocation/kubeletplugin, as
// NVIDIA's driver is: it registers with the kubelet's plugin watcher, publishes a ResourceSlice of the simulated
// node's GPUs named and described the way NVIDIA's driver names them (gpu-<minor>, attributes type, uuid,
// productName, ...), and prepares the claims the scheduler allocated from it, so that a real kubelet reports them
// in its PodResources dynamic_resources. It hands the container runtime no CDI device: there is no GPU to mount.
package draplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// DriverName is the driver's name, NVIDIA's (cmd/gpu-kubelet-plugin, DriverName).
const DriverName = "gpu.nvidia.com"

// DeviceClassExpression selects the whole GPUs of NVIDIA's driver, as the DeviceClass gpu.nvidia.com of NVIDIA's
// chart does.
const DeviceClassExpression = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"

// GPU is one GPU the plugin publishes.
type GPU struct {
	Minor       int // the N of /dev/nvidiaN: NVIDIA's driver names the device after it
	UUID        string
	ProductName string
	MemoryBytes int64
	PCIBusID    string
}

// DeviceName is the name NVIDIA's driver gives a whole GPU (deviceinfo.go, GpuInfo.CanonicalName).
func (g GPU) DeviceName() string { return fmt.Sprintf("gpu-%d", g.Minor) }

// Config says where the plugin registers and what it publishes.
type Config struct {
	Client   kubernetes.Interface // writes the ResourceSlice and reads claims
	NodeName string               // the kubelet's node; also the pool's name, as NVIDIA's driver names it
	// RegistryDir is the kubelet's plugin registration directory (<root-dir>/plugins_registry); DataDir, where
	// the plugin's own socket goes, is the driver's directory under <root-dir>/plugins. Both must exist.
	RegistryDir, DataDir string
	GPUs                 []GPU
	// DriverVersion and CUDAVersion are the node's driver and CUDA versions as semantic versions (580.95.5,
	// 13.0.0), as NVIDIA's driver publishes them.
	DriverVersion, CUDAVersion string
	Logger                     logr.Logger // the helper's log; the zero Logger discards it
}

// Plugin is a running fake DRA plugin.
type Plugin struct {
	cfg    Config
	helper *kubeletplugin.Helper

	mu       sync.Mutex
	prepared map[types.UID]Prepared
	errs     []error
}

// Prepared is a claim the kubelet asked the plugin to prepare, and the devices the plugin gave it.
type Prepared struct {
	Namespace, Name string
	Devices         []string // device names
}

// Start starts the plugin's services, registers it with the kubelet, and publishes the ResourceSlice. Stop ends it.
func Start(ctx context.Context, cfg Config) (*Plugin, error) {
	p := &Plugin{cfg: cfg, prepared: map[types.UID]Prepared{}}
	ctx = klog.NewContext(ctx, cfg.Logger)
	helper, err := kubeletplugin.Start(ctx, p,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(cfg.Client),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistryDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.DataDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("DRA plugin: starting: %w", err)
	}
	p.helper = helper
	if err := helper.PublishResources(ctx, p.resources()); err != nil {
		helper.Stop()
		return nil, fmt.Errorf("DRA plugin: publishing the ResourceSlice: %w", err)
	}
	return p, nil
}

// Stop ends the plugin's services and its ResourceSlice controller.
func (p *Plugin) Stop() { p.helper.Stop() }

// Registered reports whether the kubelet has registered the plugin.
func (p *Plugin) Registered() bool {
	s := p.helper.RegistrationStatus()
	return s != nil && s.PluginRegistered
}

// Prepared returns the claims prepared and not unprepared since, sorted by namespace and name.
func (p *Plugin) Prepared() []Prepared {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Prepared, 0, len(p.prepared))
	for _, c := range p.prepared {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Prepared) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

// Err is the errors the helper reported in the background (publishing the ResourceSlice, its gRPC servers), joined.
func (p *Plugin) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(p.errs...)
}

// resources is the ResourceSlice content: one pool named after the node, the GPUs in it, each described with the
// attributes and capacity NVIDIA's driver gives a whole GPU (deviceinfo.go, GpuInfo.GetDevice).
func (p *Plugin) resources() resourceslice.DriverResources {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	ver := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{VersionValue: &s} }
	var devices []resourceapi.Device
	for _, g := range p.cfg.GPUs {
		devices = append(devices, resourceapi.Device{
			Name: g.DeviceName(),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":                  str("gpu"),
				"uuid":                  str(g.UUID),
				"productName":           str(g.ProductName),
				"brand":                 str("Nvidia"),
				"architecture":          str("Hopper"),
				"cudaComputeCapability": ver("9.0.0"),
				"driverVersion":         ver(p.cfg.DriverVersion),
				"cudaDriverVersion":     ver(p.cfg.CUDAVersion),
				"pcieBusID":             str(g.PCIBusID),
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(g.MemoryBytes, resource.BinarySI)},
			},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		p.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

// PrepareResourceClaims gives each claim the devices of this driver that the scheduler allocated to it, refusing
// a device the plugin does not publish. The helper has checked that each claim is allocated.
func (p *Plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		out[claim.UID] = p.prepare(claim)
	}
	return out, nil
}

func (p *Plugin) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	var res kubeletplugin.PrepareResult
	if claim.Status.Allocation == nil {
		res.Err = fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
		return res
	}
	c := Prepared{Namespace: claim.Namespace, Name: claim.Name}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != p.cfg.NodeName || !slices.ContainsFunc(p.cfg.GPUs, func(g GPU) bool { return g.DeviceName() == r.Device }) {
			res.Err = fmt.Errorf("claim %s/%s: device %s/%s is not one this plugin publishes", claim.Namespace, claim.Name, r.Pool, r.Device)
			return res
		}
		res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
		c.Devices = append(c.Devices, r.Device)
	}
	p.mu.Lock()
	p.prepared[claim.UID] = c
	p.mu.Unlock()
	return res
}

// UnprepareResourceClaims forgets the claims; an unknown claim is not an error, as the helper requires.
func (p *Plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range claims {
		delete(p.prepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError keeps background errors for Err. None is fatal to a test plugin: the test that reads Err decides.
func (p *Plugin) HandleError(_ context.Context, err error, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, fmt.Errorf("%s: %w", msg, err))
}

// WatchHealthStatus is never called: Start turns the health service off.
func (p *Plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
