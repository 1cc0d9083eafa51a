// Package basicauth checks HTTP basic-auth passwords against bcrypt hashes so that clients with wrong passwords
// cannot lock out the ones with right passwords. A bcrypt check costs tens of milliseconds of CPU by design, so:
//   - a right password, once checked, is remembered (as a keyed digest, compared in constant time) and costs no
//     bcrypt again while its hash stays the same;
//   - failed checks are bounded: a few at once in all, one at a time per client, and a budget per client that refills
//     slowly; a check over a bound is refused at once, without bcrypt;
//   - a check whose client has gone (its request context done) does no bcrypt, and identical checks in flight share
//     one bcrypt.
//
// The checks refused are counted in the Checker's self-metrics.
package basicauth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"
)

// ErrBusy is a check refused without being made: its client, or all clients together, are over a bound of failed
// checks. The server answers 429, which says nothing about the password.
var ErrBusy = errors.New("too many password checks; try again later")

// Defaults of Config.
const (
	DefaultMaxWaiting      = 8
	DefaultFailureBurst    = 5
	DefaultFailureInterval = 10 * time.Second
	DefaultMaxClients      = 4096
)

// maxRemembered bounds the right passwords remembered: one per user of the web configuration, and its users' hashes.
const maxRemembered = 1024

// fakeHash is checked for a user that does not exist, so that an unknown user takes as long as a wrong password
// and cannot be told apart by timing. It is a bcrypt hash (cost 10, as htpasswd makes them) of a random password.
const fakeHash = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"

// Config bounds the work of a Checker. Zero fields take their defaults.
type Config struct {
	// MaxConcurrent is how many bcrypt checks run at once: by default half the CPUs the Go runtime uses (at least
	// one), leaving the rest to the scrapes.
	MaxConcurrent int
	// MaxWaiting is how many checks may wait for one of those; a check beyond it is refused.
	MaxWaiting int
	// FailureBurst is how many failed checks a client may make in a row; after that, one per FailureInterval.
	FailureBurst    int
	FailureInterval time.Duration
	// MaxClients is how many clients' budgets are remembered. Past it, clients whose budget is full are forgotten,
	// and new clients share one budget until there is room.
	MaxClients int
	// Compare checks a password against a hash; bcrypt.CompareHashAndPassword by default (tests count calls).
	Compare func(hash, password []byte) error
	// Now is the clock of the budgets; time.Now by default.
	Now func() time.Time
}

// Checker checks passwords. It is safe for concurrent use.
type Checker struct {
	cfg     Config
	slots   chan struct{} // a token per bcrypt check running
	key     []byte        // of the digests of remembered passwords
	mu      sync.Mutex
	waiting int
	valid   map[credential][sha256.Size]byte // user and hash: the digest of the password that matched
	flights map[flightKey]*flight
	clients map[string]*client
	shared  client // the budget of new clients while clients is full
	// Checks refused (ErrBusy) since the Checker was made, by reason: the client's bounds, or all clients' together.
	refusedClient, refusedBusy uint64
}

var refusedDesc = prometheus.NewDesc("gpu_pod_exporter_basic_auth_refused_total",
	"Requests answered 429 without a password check, by reason: client (its budget of failed checks is spent, or it has "+
		"a check in flight), busy (as many checks wait for bcrypt as may).", []string{"reason"}, nil)

// Describe implements prometheus.Collector for the Checker's self-metrics.
func (c *Checker) Describe(ch chan<- *prometheus.Desc) { ch <- refusedDesc }

// Collect implements prometheus.Collector for the Checker's self-metrics.
func (c *Checker) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	client, busy := c.refusedClient, c.refusedBusy
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(client), "client")
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(busy), "busy")
}

type credential struct{ user, hash string }

type flightKey struct {
	credential
	digest [sha256.Size]byte
}

// flight is a bcrypt check in progress, whose result identical checks wait for.
type flight struct {
	done chan struct{}
	ok   bool
	err  error
}

// client is what is known of one client: its failed-check budget and whether it has a check in flight.
type client struct {
	tokens   float64
	at       time.Time // when tokens was last brought up to date
	inFlight bool
}

// New returns a Checker with cfg's bounds.
func New(cfg Config) *Checker {
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = max(1, runtime.GOMAXPROCS(0)/2)
	}
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.FailureBurst <= 0 {
		cfg.FailureBurst = DefaultFailureBurst
	}
	if cfg.FailureInterval <= 0 {
		cfg.FailureInterval = DefaultFailureInterval
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = DefaultMaxClients
	}
	if cfg.Compare == nil {
		cfg.Compare = bcrypt.CompareHashAndPassword
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand panics rather than return an error)
	c := &Checker{
		cfg: cfg, slots: make(chan struct{}, cfg.MaxConcurrent), key: key,
		valid: map[credential][sha256.Size]byte{}, flights: map[flightKey]*flight{}, clients: map[string]*client{},
	}
	c.shared.tokens = float64(cfg.FailureBurst)
	c.shared.at = cfg.Now()
	return c
}

// Check reports whether password is user's. hash is user's bcrypt hash, "" when there is no such user (then the
// answer is false, after as much work as a wrong password). clientAddr is where the request comes from (host:port or
// host), the unit of the per-client bounds. The error is ErrBusy when the check was refused, or ctx's error when the
// client went away first; either way no answer was reached.
func (c *Checker) Check(ctx context.Context, clientAddr, user, hash, password string) (bool, error) {
	if err := ctx.Err(); err != nil { // an HTTP/2 stream reset as it was sent, a client that hung up
		return false, err
	}
	known := hash != ""
	if !known {
		hash = fakeHash
	}
	key := flightKey{credential{user, hash}, c.digest(password)}
	for {
		c.mu.Lock()
		if want, ok := c.valid[key.credential]; ok && known && hmac.Equal(want[:], key.digest[:]) {
			c.mu.Unlock()
			return true, nil
		}
		f, ok := c.flights[key]
		if !ok {
			return c.lead(ctx, clientAddr, key, password, known) // unlocks c.mu
		}
		// The same check is in flight, from this client or another: its answer is this one's, unless its client
		// went away first.
		c.mu.Unlock()
		select {
		case <-f.done:
			if f.err == nil {
				return f.ok, nil
			}
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// lead makes a check that no other is making, within the bounds. c.mu is held on entry and released.
func (c *Checker) lead(ctx context.Context, clientAddr string, key flightKey, password string, known bool) (bool, error) {
	cl := c.client(clientAddr)
	switch {
	case cl.inFlight || cl.tokens < 1:
		c.refusedClient++
		c.mu.Unlock()
		return false, ErrBusy
	case len(c.slots) == cap(c.slots) && c.waiting >= c.cfg.MaxWaiting:
		c.refusedBusy++
		c.mu.Unlock()
		return false, ErrBusy
	}
	cl.inFlight = true
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.waiting++
	c.mu.Unlock()

	ok, err := c.compare(ctx, []byte(key.hash), []byte(password))
	f.ok, f.err = ok && known, err

	c.mu.Lock()
	delete(c.flights, key)
	cl.inFlight = false
	switch {
	case f.err != nil:
	case f.ok:
		if len(c.valid) >= maxRemembered {
			clear(c.valid) // only a web configuration with that many users, or changed that often, fills it
		}
		c.valid[key.credential] = key.digest
	default:
		cl.tokens--
	}
	c.mu.Unlock()
	close(f.done)
	return f.ok, f.err
}

// compare runs one bcrypt check when a slot is free, unless ctx ends first. It is counted in c.waiting on entry.
func (c *Checker) compare(ctx context.Context, hash, password []byte) (bool, error) {
	acquired := false
	select {
	case c.slots <- struct{}{}:
		acquired = true
	case <-ctx.Done():
	}
	c.mu.Lock()
	c.waiting--
	c.mu.Unlock()
	if acquired {
		defer func() { <-c.slots }()
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return c.cfg.Compare(hash, password) == nil, nil
}

// client returns the budget of the client at addr, brought up to date. c.mu is held.
func (c *Checker) client(addr string) *client {
	now := c.cfg.Now()
	id := clientID(addr)
	cl, ok := c.clients[id]
	if !ok {
		if len(c.clients) >= c.cfg.MaxClients {
			c.forgetRested(now)
		}
		if len(c.clients) >= c.cfg.MaxClients {
			cl = &c.shared
		} else {
			cl = &client{tokens: float64(c.cfg.FailureBurst), at: now}
			c.clients[id] = cl
		}
	}
	c.refill(cl, now)
	return cl
}

func (c *Checker) refill(cl *client, now time.Time) {
	if elapsed := now.Sub(cl.at); elapsed > 0 {
		cl.tokens = min(float64(c.cfg.FailureBurst), cl.tokens+float64(elapsed)/float64(c.cfg.FailureInterval))
		cl.at = now
	}
}

// forgetRested forgets the clients whose budget is full again and that have nothing in flight: they are as new.
func (c *Checker) forgetRested(now time.Time) {
	for id, cl := range c.clients {
		c.refill(cl, now)
		if !cl.inFlight && cl.tokens >= float64(c.cfg.FailureBurst) {
			delete(c.clients, id)
		}
	}
}

// digest is a keyed digest of a password: what is remembered of a right one, and what identical checks share.
func (c *Checker) digest(password string) [sha256.Size]byte {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(password))
	var d [sha256.Size]byte
	m.Sum(d[:0])
	return d
}

// clientID is the client's address without its port; an IPv6 client is its /64, the block one host usually has.
func clientID(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() != nil {
		return ip.To4().String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String()
}
