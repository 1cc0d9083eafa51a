package cri

import (
	"sync"
	"time"
)

// pod is what the resolver keeps of a pod sandbox.
type pod struct {
	namespace, name, uid string
	labels               map[string]string // the pod's own labels; never modified once cached
}

// podCache holds pods by UID so that the containers of one pod cost one sandbox lookup. It is bounded in size,
// and entries expire so that pods which are gone are forgotten.
type podCache struct {
	mu      sync.Mutex
	entries map[string]podEntry
	size    int
	ttl     time.Duration
	now     func() time.Time
}

type podEntry struct {
	pod     pod
	expires time.Time
}

func newPodCache(size int, ttl time.Duration, now func() time.Time) *podCache {
	return &podCache{entries: make(map[string]podEntry), size: size, ttl: ttl, now: now}
}

func (c *podCache) get(uid string) (pod, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[uid]
	if !ok {
		return pod{}, false
	}
	if !c.now().Before(e.expires) {
		delete(c.entries, uid)
		return pod{}, false
	}
	return e.pod, true
}

func (c *podCache) put(uid string, p pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if _, ok := c.entries[uid]; !ok && len(c.entries) >= c.size {
		c.evict(now)
	}
	c.entries[uid] = podEntry{pod: p, expires: now.Add(c.ttl)}
}

// evict makes room for one entry: it drops every expired entry, or failing that the one closest to expiry.
// It scans the whole map, which only happens once the cache is full.
func (c *podCache) evict(now time.Time) {
	var oldest string
	var oldestExpiry time.Time
	for uid, e := range c.entries {
		if !now.Before(e.expires) {
			delete(c.entries, uid)
			continue
		}
		if oldest == "" || e.expires.Before(oldestExpiry) {
			oldest, oldestExpiry = uid, e.expires
		}
	}
	if len(c.entries) >= c.size {
		delete(c.entries, oldest)
	}
}
