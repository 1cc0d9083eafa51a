// Package basicauth checks HTTP basic-auth passwords against bcrypt hashes so that clients with wrong passwords
// cannot lock out the ones with right passwords. A bcrypt check costs tens of milliseconds of CPU by design, so:
//   - a right password, once checked, is remembered (as a keyed digest, compared in constant time) and costs no
//     bcrypt again while its hash stays the same;
//   - failed checks are bounded: a few at once in all, one at a time per client, and a budget per client that refills
//     slowly; a check over a bound is refused at once, without bcrypt;
//   - the checks waiting for bcrypt go by standing, then first come. First the clients with more whole failed checks
//     of their budget left; then a password that was refused before it could be checked, asked again (Prometheus
//     asks with its one password at every scrape; a flood guesses a new one each time); then the clients refused
//     fewer times lately, counted in powers of two (a count that halves every FailureInterval: a client that scrapes
//     is refused a few times at most, one that asks again as soon as it is answered sinks with every refusal). A
//     check that goes before the waiting check that goes last takes its place when there is no room. So Prometheus,
//     even right after a restart under a flood, before its password is remembered, waits only for the first
//     attempts of the addresses that came before it: its first scrape may be refused among them, which it cannot
//     be told from, and its next goes first;
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
	"math"
	"net"
	"runtime"
	"slices"
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
	key     []byte // of the digests of remembered passwords
	mu      sync.Mutex
	running int                              // bcrypt checks running
	waiting []*waiter                        // checks waiting for one of those to end, at most MaxWaiting
	seq     uint64                           // of the last check to wait
	valid   map[credential][sha256.Size]byte // user and hash: the digest of the password that matched
	flights map[flightKey]*flight
	// refused are passwords refused before they could be checked, from clients in good standing: asked again, they
	// go first.
	refused recentSet
	clients map[string]*client
	shared  client // the budget of new clients while clients is full
	// Checks refused (ErrBusy) since the Checker was made, by reason: the client's bounds, or all clients' together.
	refusedClient, refusedBusy uint64
}

var refusedDesc = prometheus.NewDesc("gpu_pod_exporter_basic_auth_refused_total",
	"Requests answered 429 without a password check, by reason: client (its budget of failed checks is spent, or it has "+
		"a check in flight), busy (as many checks wait for bcrypt as may, from clients in no worse standing, or one in "+
		"better standing took its place).", []string{"reason"}, nil)

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

// client is what is known of one client: its budget of failed checks, how many checks it asked for lately, and
// whether it has a check in flight.
type client struct {
	tokens   float64
	refused  float64   // requests refused (429), each counted 1 and halving every FailureInterval
	at       time.Time // when tokens and refused were last brought up to date
	inFlight bool
}

// waiter is a check waiting for bcrypt. It is told on turn whether it got a slot (true) or lost its place (false).
type waiter struct {
	standing standing // its client's, when it came
	seq      uint64
	client   *client
	turn     chan bool
}

// standing is a check's place in the queue: its client's whole failed checks left, whether it asks again for a
// password refused before it could be checked, then its client's refusals lately in powers of two (0 for none, or
// one decayed a little; 1 for one to two; 2 up to six...).
type standing struct {
	tokens  int
	again   bool
	refused int
}

func (cl *client) standing(again bool) standing {
	return standing{tokens: int(cl.tokens), again: again, refused: int(math.Log2(cl.refused + 1))}
}

// above reports whether s is the better standing.
func (s standing) above(o standing) bool {
	switch {
	case s.tokens != o.tokens:
		return s.tokens > o.tokens
	case s.again != o.again:
		return s.again
	}
	return s.refused < o.refused
}

// before reports whether w goes before o: better standing, then first come.
func (w *waiter) before(o *waiter) bool {
	if w.standing != o.standing {
		return w.standing.above(o.standing)
	}
	return w.seq < o.seq
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
		cfg: cfg, key: key,
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
	if cl.inFlight || cl.tokens < 1 {
		c.refusedClient++
		c.refuse(cl, key)
		c.mu.Unlock()
		return false, ErrBusy
	}
	var w *waiter
	if c.running >= c.cfg.MaxConcurrent {
		if w = c.wait(cl, key); w == nil {
			c.refusedBusy++
			c.refuse(cl, key)
			c.mu.Unlock()
			return false, ErrBusy
		}
	} else {
		c.running++
	}
	cl.inFlight = true
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.mu.Unlock()

	ok, err := false, error(ErrBusy)
	if w == nil || c.await(ctx, w) {
		ok, err = false, ctx.Err()
		if err == nil {
			ok = c.cfg.Compare([]byte(key.hash), []byte(password)) == nil
		}
		c.mu.Lock()
		c.release()
		c.mu.Unlock()
	} else if ctx.Err() != nil {
		err = ctx.Err()
	}
	f.ok, f.err = ok && known, err

	c.mu.Lock()
	delete(c.flights, key)
	cl.inFlight = false
	switch {
	case errors.Is(f.err, ErrBusy): // its place was taken
		c.refuse(cl, key)
	case f.err != nil:
	case f.ok:
		c.refused.remove(key)
		if len(c.valid) >= maxRemembered {
			clear(c.valid) // only a web configuration with that many users, or changed that often, fills it
		}
		c.valid[key.credential] = key.digest
	default:
		c.refused.remove(key)
		cl.tokens--
	}
	c.mu.Unlock()
	close(f.done)
	return f.ok, f.err
}

// refuse notes a request of cl for key refused without a check: the client's refusals lately, and the password,
// when the client is in good standing, so that asked again it goes first. c.mu is held.
func (c *Checker) refuse(cl *client, key flightKey) {
	if cl.standing(false).refused == 0 {
		c.refused.add(key)
	}
	cl.refused++
}

// wait queues a check of client cl for the next free slot: in the room left, or in the place of the waiting check
// that goes last when cl's goes before it, whose client is then told it lost its place. It returns nil when the
// check cannot wait. c.mu is held.
func (c *Checker) wait(cl *client, key flightKey) *waiter {
	c.seq++
	w := &waiter{standing: cl.standing(c.refused.has(key)), seq: c.seq, client: cl, turn: make(chan bool, 1)}
	if len(c.waiting) >= c.cfg.MaxWaiting {
		last := 0
		for i, o := range c.waiting {
			if c.waiting[last].before(o) {
				last = i
			}
		}
		if len(c.waiting) == 0 || !w.before(c.waiting[last]) {
			return nil
		}
		displaced := c.waiting[last]
		c.waiting = slices.Delete(c.waiting, last, last+1)
		c.refusedBusy++
		displaced.turn <- false // its client's refusal is noted as it returns
	}
	c.waiting = append(c.waiting, w)
	return w
}

// await waits for w's turn, unless ctx ends first; it reports whether w holds a slot now.
func (c *Checker) await(ctx context.Context, w *waiter) bool {
	select {
	case got := <-w.turn:
		return got
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.waiting, w); i >= 0 {
		c.waiting = slices.Delete(c.waiting, i, i+1)
		return false
	}
	// Given a slot or its place taken as ctx ended: a slot is handed on.
	if <-w.turn {
		c.release()
	}
	return false
}

// release ends a bcrypt check: its slot goes to the waiting check that goes first. c.mu is held.
func (c *Checker) release() {
	if len(c.waiting) == 0 {
		c.running--
		return
	}
	first := 0
	for i, w := range c.waiting {
		if w.before(c.waiting[first]) {
			first = i
		}
	}
	w := c.waiting[first]
	c.waiting = slices.Delete(c.waiting, first, first+1)
	w.turn <- true
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
		intervals := float64(elapsed) / float64(c.cfg.FailureInterval)
		cl.tokens = min(float64(c.cfg.FailureBurst), cl.tokens+intervals)
		cl.refused *= math.Exp2(-intervals)
		cl.at = now
	}
}

// forgetRested forgets the clients whose budget is full again, that were refused less than once lately and that have
// nothing in flight: they are as new.
func (c *Checker) forgetRested(now time.Time) {
	for id, cl := range c.clients {
		c.refill(cl, now)
		if !cl.inFlight && cl.tokens >= float64(c.cfg.FailureBurst) && cl.refused < 1 {
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

// maxRefusedRemembered bounds the passwords remembered as refused before a check: far more than the clients in
// good standing refused at once (a flood's addresses each add one, at its first attempt).
const maxRefusedRemembered = 4096

// recentSet is a set of the last maxRefusedRemembered keys added.
type recentSet struct {
	keys  map[flightKey]int // the slot of each in order
	order []flightKey       // a ring; once full, next is the oldest slot
	next  int
}

func (r *recentSet) has(k flightKey) bool {
	_, ok := r.keys[k]
	return ok
}

func (r *recentSet) add(k flightKey) {
	if r.keys == nil {
		r.keys = make(map[flightKey]int)
	}
	if r.has(k) {
		return
	}
	slot := len(r.order)
	if slot < maxRefusedRemembered {
		r.order = append(r.order, k)
	} else {
		slot, r.next = r.next, (r.next+1)%maxRefusedRemembered
		if old := r.order[slot]; r.keys[old] == slot {
			delete(r.keys, old)
		}
		r.order[slot] = k
	}
	r.keys[k] = slot
}

func (r *recentSet) remove(k flightKey) { delete(r.keys, k) }
