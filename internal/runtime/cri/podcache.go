package cri

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"
)

// pod is what the resolver keeps of a pod sandbox.
type pod struct {
	namespace, name, uid string
	labels               map[string]string // the pod's allowlisted labels; never modified once cached
}

// The estimated cost of a cache entry beyond its strings' bytes: the map slots, the entry and the string and map
// headers. An estimate, so that the byte bound holds for many small labels as for a few large ones.
const (
	entryOverhead = 160
	labelOverhead = 48
)

// size is the estimated memory an entry of p under key holds.
func (p pod) size(key podKey) int {
	n := entryOverhead + len(key.endpoint) + len(key.uid) + len(p.namespace) + len(p.name) + len(p.uid)
	for k, v := range p.labels {
		n += labelOverhead + len(k) + len(v)
	}
	return n
}

// podKey is a pod on one runtime endpoint: two runtimes on a node each have their own pods.
type podKey struct{ endpoint, uid string }

// podCache holds pods so that the containers of one pod cost one sandbox lookup. It holds what the resolver keeps:
// the allowlisted labels only, bounded in entries and in bytes, and only the pods that the latest complete reading
// has processes in (keep). An entry also expires ttl after it was cached, for a node whose readings are never
// complete. It is safe for concurrent use.
type podCache struct {
	mu                   sync.Mutex
	entries              map[podKey]podEntry
	bytes                int // the entries' size, summed
	maxEntries, maxBytes int
	ttl                  time.Duration
	now                  func() time.Time
}

type podEntry struct {
	pod     pod
	expires time.Time
	bytes   int
}

func newPodCache(maxEntries, maxBytes int, ttl time.Duration, now func() time.Time) *podCache {
	return &podCache{entries: make(map[podKey]podEntry), maxEntries: maxEntries, maxBytes: maxBytes, ttl: ttl, now: now}
}

func (c *podCache) get(key podKey) (pod, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return pod{}, false
	}
	if !c.now().Before(e.expires) {
		c.drop(key, e)
		return pod{}, false
	}
	return e.pod, true
}

// put caches a pod, making room by dropping expired entries, then those closest to expiry. A pod larger than the
// whole cache is not cached: its containers each cost a lookup.
func (c *podCache) put(key podKey, p pod) {
	size := p.size(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[key]; ok {
		c.drop(key, old)
	}
	if size > c.maxBytes {
		return
	}
	now := c.now()
	if len(c.entries) >= c.maxEntries || c.bytes+size > c.maxBytes {
		c.evict(now, size)
	}
	c.entries[key] = podEntry{pod: p, expires: now.Add(c.ttl), bytes: size}
	c.bytes += size
}

// keep drops every pod whose UID is not in uids, and every expired one.
func (c *podCache) keep(uids map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for key, e := range c.entries {
		if !uids[key.uid] || !now.Before(e.expires) {
			c.drop(key, e)
		}
	}
}

// usage returns the number of entries and their estimated bytes.
func (c *podCache) usage() (entries, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}

func (c *podCache) drop(key podKey, e podEntry) {
	delete(c.entries, key)
	c.bytes -= e.bytes
}

// evict makes room for one entry of size bytes: it drops every expired entry, then, while there is still no room,
// the entries closest to expiry. It scans the whole cache, which only happens once it is full.
func (c *podCache) evict(now time.Time, size int) {
	for key, e := range c.entries {
		if !now.Before(e.expires) {
			c.drop(key, e)
		}
	}
	if len(c.entries) < c.maxEntries && c.bytes+size <= c.maxBytes {
		return
	}
	keys := slices.SortedFunc(maps.Keys(c.entries), func(a, b podKey) int {
		return cmp.Compare(c.entries[a].expires.UnixNano(), c.entries[b].expires.UnixNano())
	})
	for _, key := range keys {
		if len(c.entries) < c.maxEntries && c.bytes+size <= c.maxBytes {
			return
		}
		c.drop(key, c.entries[key])
	}
}
