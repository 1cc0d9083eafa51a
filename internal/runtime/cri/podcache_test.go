package cri

import (
	"fmt"
	"testing"
	"time"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestPodCacheExpires(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	c := newPodCache(10, time.Minute, clock.now)
	c.put("a", pod{name: "a"})
	clock.t = clock.t.Add(59 * time.Second)
	if p, ok := c.get("a"); !ok || p.name != "a" {
		t.Fatalf("get before expiry = %+v, %v", p, ok)
	}
	clock.t = clock.t.Add(time.Second)
	if _, ok := c.get("a"); ok {
		t.Fatal("entry still served at its expiry time")
	}
	if len(c.entries) != 0 {
		t.Errorf("expired entry kept: len = %d", len(c.entries))
	}
}

func TestPodCacheIsBounded(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	c := newPodCache(3, time.Minute, clock.now)
	for i := range 3 {
		c.put(fmt.Sprint(i), pod{})
		clock.t = clock.t.Add(time.Second)
	}
	c.put("3", pod{})
	if len(c.entries) != 3 {
		t.Fatalf("len = %d, want the cap 3", len(c.entries))
	}
	if _, ok := c.get("0"); ok {
		t.Error("the entry closest to expiry was kept over the new one")
	}
	for _, uid := range []string{"1", "2", "3"} {
		if _, ok := c.get(uid); !ok {
			t.Errorf("entry %s evicted, want only the oldest gone", uid)
		}
	}
	// Refreshing an entry that is already there never evicts another.
	c.put("3", pod{name: "again"})
	if len(c.entries) != 3 {
		t.Errorf("len = %d after refreshing an entry, want 3", len(c.entries))
	}

	// Once everything has expired, one insert clears them all.
	clock.t = clock.t.Add(time.Hour)
	c.put("4", pod{})
	if len(c.entries) != 1 {
		t.Errorf("len = %d after inserting into a cache of expired entries, want 1", len(c.entries))
	}
}
