package cri

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func key(uid string) podKey { return podKey{"unix:///run/cri.sock", uid} }

// checkUsage fails the test unless the cache holds n entries and its byte count is theirs.
func checkUsage(t *testing.T, c *podCache, n int) {
	t.Helper()
	entries, bytes := c.usage()
	sum := 0
	for k, e := range c.entries {
		sum += e.pod.size(k)
	}
	if entries != n || bytes != sum {
		t.Errorf("usage = %d entries, %d bytes; want %d entries, %d bytes", entries, bytes, n, sum)
	}
}

func TestPodCacheExpires(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	c := newPodCache(10, 1<<20, time.Minute, clock.now)
	c.put(key("a"), pod{name: "a"})
	clock.t = clock.t.Add(59 * time.Second)
	if p, ok := c.get(key("a")); !ok || p.name != "a" {
		t.Fatalf("get before expiry = %+v, %v", p, ok)
	}
	clock.t = clock.t.Add(time.Second)
	if _, ok := c.get(key("a")); ok {
		t.Fatal("entry still served at its expiry time")
	}
	checkUsage(t, c, 0)
}

func TestPodCacheIsBounded(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	c := newPodCache(3, 1<<20, time.Minute, clock.now)
	for i := range 3 {
		c.put(key(fmt.Sprint(i)), pod{})
		clock.t = clock.t.Add(time.Second)
	}
	c.put(key("3"), pod{})
	checkUsage(t, c, 3)
	if _, ok := c.get(key("0")); ok {
		t.Error("the entry closest to expiry was kept over the new one")
	}
	for _, uid := range []string{"1", "2", "3"} {
		if _, ok := c.get(key(uid)); !ok {
			t.Errorf("entry %s evicted, want only the oldest gone", uid)
		}
	}
	// Refreshing an entry that is already there never evicts another.
	c.put(key("3"), pod{name: "again"})
	checkUsage(t, c, 3)

	// Once everything has expired, one insert clears them all.
	clock.t = clock.t.Add(time.Hour)
	c.put(key("4"), pod{})
	checkUsage(t, c, 1)
}

// The bytes are bounded as well as the entries: large pods push the oldest out, and one larger than the whole
// cache is not cached at all.
func TestPodCacheBoundsBytes(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	big := func(n int) pod { return pod{name: "p", labels: map[string]string{"a": strings.Repeat("x", n)}} }
	limit := 3 * big(1000).size(key("0"))
	c := newPodCache(100, limit, time.Minute, clock.now)
	for i := range 5 {
		c.put(key(fmt.Sprint(i)), big(1000))
		clock.t = clock.t.Add(time.Second)
	}
	checkUsage(t, c, 3)
	if _, bytes := c.usage(); bytes > limit {
		t.Errorf("%d bytes cached, over the bound of %d", bytes, limit)
	}
	for uid, want := range map[string]bool{"0": false, "1": false, "2": true, "3": true, "4": true} {
		if _, ok := c.get(key(uid)); ok != want {
			t.Errorf("entry %s cached = %v, want %v", uid, ok, want)
		}
	}

	c.put(key("huge"), big(limit))
	if _, ok := c.get(key("huge")); ok {
		t.Error("a pod larger than the cache was cached")
	}
	checkUsage(t, c, 3)
	// Replacing an entry by a larger one keeps the count right.
	c.put(key("4"), big(2000))
	checkUsage(t, c, 2)
}

// keep forgets the pods not listed, on every endpoint, and the expired ones.
func TestPodCacheKeep(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	c := newPodCache(10, 1<<20, time.Minute, clock.now)
	other := podKey{"unix:///run/other.sock", "a"}
	for _, k := range []podKey{key("a"), key("b"), other} {
		c.put(k, pod{name: k.uid})
	}
	clock.t = clock.t.Add(30 * time.Second)
	c.put(key("new"), pod{})
	live := map[string]bool{"a": true, "new": true}
	check := func(want map[podKey]bool) {
		t.Helper()
		for k, want := range want {
			if _, ok := c.entries[k]; ok != want {
				t.Errorf("%v kept = %v, want %v", k, ok, want)
			}
		}
		checkUsage(t, c, len(c.entries))
	}
	c.keep(live)
	check(map[podKey]bool{key("a"): true, other: true, key("b"): false, key("new"): true})

	clock.t = clock.t.Add(40 * time.Second) // past a's expiry, not new's
	c.keep(live)
	check(map[podKey]bool{key("a"): false, other: false, key("new"): true})

	c.keep(nil)
	checkUsage(t, c, 0)
}

// floodRuntime is a runtime of pods whose sandboxes carry a megabyte of labels each, one container per pod. The
// megabyte is one string shared by every sandbox, so that only what the resolver keeps of its answers counts in
// the heap.
func floodRuntime(pods int) *fakeRuntime {
	blob := strings.Repeat("x", 1<<20)
	f := &fakeRuntime{containers: make(map[string]*runtimeapi.ContainerStatus)}
	for i := range pods {
		uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
		id := fmt.Sprintf("%064x", 0xf100d000+i)
		f.containers[id] = &runtimeapi.ContainerStatus{Id: id, Metadata: &runtimeapi.ContainerMetadata{Name: "c"},
			Labels: map[string]string{runtime.LabelPodUID: uid, runtime.LabelContainerName: "c"}}
		f.sandboxes = append(f.sandboxes, &runtimeapi.PodSandbox{
			Id:       fmt.Sprintf("%064x", 0x5a4db0c5000+i),
			Metadata: &runtimeapi.PodSandboxMetadata{Name: fmt.Sprint("pod-", i), Namespace: "flood", Uid: uid},
			Labels:   map[string]string{runtime.LabelPodUID: uid, "app": "flood", "blob": blob},
		})
	}
	return f
}

// heapAfterGC is the live heap, in bytes, after full collections: two, which empty the sync.Pools (gRPC's buffers).
func heapAfterGC() uint64 {
	goruntime.GC()
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A flood of pods whose sandboxes carry a megabyte of labels each, then every one of them gone: the cache keeps
// only the allowlisted labels, bounds its bytes when the allowlist takes the large ones too, and once a complete
// reading names none of the pods (KeepPods, as attribution calls it), holds nothing, in its own count and in the
// heap.
func TestPodCacheAfterALabelFlood(t *testing.T) {
	const pods = 200
	for _, c := range []struct {
		name      string
		allowlist []string
		maxBytes  int // what the cache may hold while the pods run
	}{
		{"the large label is not allowlisted", []string{"app"}, pods * 512},
		{"the large label is allowlisted", []string{"app", "blob"}, podCacheBytes},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := floodRuntime(pods)
			r, err := New(Config{Endpoints: []string{serve(t, f)}, PodLabels: c.allowlist})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			// Connected first: the connection is not what is measured.
			if _, err := r.Resolve(t.Context(), unknownID); !errors.Is(err, runtime.ErrNotFound) {
				t.Fatalf("Resolve(unknown) = %v, want ErrNotFound", err)
			}
			before := heapAfterGC()
			for id := range f.containers {
				got, err := r.Resolve(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				if got.PodLabels["app"] != "flood" || len(got.PodLabels) != len(c.allowlist) {
					t.Fatalf("pod labels %d, want the %d allowlisted", len(got.PodLabels), len(c.allowlist))
				}
			}
			entries, bytes := r.pods.usage()
			t.Logf("%d pods running: the cache holds %d entries, %d bytes; the heap changed by %+d KiB",
				pods, entries, bytes, (int64(heapAfterGC())-int64(before))>>10)
			if bytes > c.maxBytes {
				t.Errorf("the cache holds %d bytes, want at most %d", bytes, c.maxBytes)
			}

			f.mu.Lock()
			f.containers, f.sandboxes = nil, nil // every pod gone
			f.mu.Unlock()
			r.KeepPods(map[string]bool{})
			entries, bytes = r.pods.usage()
			retained := int64(heapAfterGC()) - int64(before)
			t.Logf("every pod gone: the cache holds %d entries, %d bytes; the heap changed by %+d KiB", entries, bytes, retained>>10)
			if entries != 0 || bytes != 0 {
				t.Errorf("the cache holds %d entries, %d bytes, after every pod is gone", entries, bytes)
			}
			if err := testutil.CollectAndCompare(r, strings.NewReader(podCacheMetrics(0, 0))); err != nil {
				t.Error(err)
			}
			// A megabyte kept of a single pod would show; the gRPC connection's buffers stay.
			if retained > 1<<20 {
				t.Errorf("the heap is %d KiB above where it started after every pod is gone", retained>>10)
			}
		})
	}
}

// podCacheMetrics is the exposition of the pod cache's self-metrics.
func podCacheMetrics(entries, bytes int) string {
	return fmt.Sprintf(`# HELP gpu_pod_exporter_resolver_pod_cache_bytes Estimated memory of the kept pod sandboxes' names and allowlisted labels.
# TYPE gpu_pod_exporter_resolver_pod_cache_bytes gauge
gpu_pod_exporter_resolver_pod_cache_bytes{resolver="cri"} %d
# HELP gpu_pod_exporter_resolver_pod_cache_entries Pod sandboxes the resolver keeps, so that the containers of one pod cost one sandbox lookup: the pods of the last complete reading's processes.
# TYPE gpu_pod_exporter_resolver_pod_cache_entries gauge
gpu_pod_exporter_resolver_pod_cache_entries{resolver="cri"} %d
`, bytes, entries)
}

// The self-metrics say what the cache holds, and pass the linter.
func TestPodCacheMetrics(t *testing.T) {
	r := newTestResolver(t, serve(t, fixtureRuntime()))
	if _, err := r.Resolve(t.Context(), trainerID); err != nil {
		t.Fatal(err)
	}
	entries, bytes := r.pods.usage()
	if entries != 1 || bytes == 0 {
		t.Fatalf("usage = %d entries, %d bytes after one pod", entries, bytes)
	}
	if err := testutil.CollectAndCompare(r, strings.NewReader(podCacheMetrics(entries, bytes))); err != nil {
		t.Error(err)
	}
	problems, err := testutil.CollectAndLint(r)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
