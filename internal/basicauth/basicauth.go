// Package basicauth checks HTTP basic-auth passwords against bcrypt hashes so that clients with wrong passwords
// cannot lock out the ones with right passwords. A bcrypt check costs tens of milliseconds of CPU by design, so:
//   - a right password, once checked, is remembered (as a keyed digest, compared in constant time) and costs no
//     bcrypt again while its hash stays the same;
//   - failed checks are bounded: a few at once in all, one at a time per client and kind of check (see below), and
//     a budget per client address that refills slowly; a check over a bound is refused at once, without bcrypt;
//   - a password refused on a connection before it could be checked, and asked again on the same connection, is
//     checked as soon as a slot is free, even while its client's budget is spent, which it may overdraw by one
//     failed check: a scraper asks with its one password at every scrape on one keep-alive connection, a flood
//     guesses anew, and a flood that shares the scraper's address (NAT, a shared egress, the same node) cannot
//     reach the scraper's connection. So the right password is checked at the scrape after the one refused, and
//     then remembered;
//   - the checks waiting for bcrypt go by standing: a password asked again first, then the clients with more
//     whole failed checks of their budget left, then the clients refused fewer times lately (a count that halves
//     every FailureInterval, in powers of two: one that asks again as soon as it is refused sinks with every
//     refusal). Among checks of equal standing the newest goes first, and when there is no room a new check takes
//     the place of the newest of the lowest standing;
//   - a first attempt of a client in the best standing (none of its budget spent, not refused lately: every client
//     after a restart) that loses its place, or finds none, is not refused but waits in a line of up to
//     MaxFirstWaiting, behind the waiting checks of its standing and before those of lower standing, newest first,
//     for at most FirstWait (less than Prometheus's default scrape timeout, 10 s) and until a second before its
//     request's deadline (the server's from the scrape timeout Prometheus sends); then it is refused. A flood's
//     first attempts after a restart cannot be told from a scraper's, and come in a burst as their TLS handshakes
//     end: a scraper that comes after the burst is checked next, one among the first of it keeps its place until
//     the burst ends, and one in the middle of it waits in the line. Each address of the flood gets one bcrypt so,
//     and then its budget applies; the line adds no bcrypt (MaxConcurrent at once, busy under any flood), it only
//     gives first attempts their turn first. A scraper deeper in a burst than MaxConcurrent slots can check in its
//     time in the line (about a hundred in 8 s on one core, at cost 10) is refused then, and goes first at its next
//     scrape (above);
//   - past MaxClients client addresses, the clients in the best standing are forgotten (a client forgotten comes
//     back new, in the best standing, so forgetting it gives nothing away); the flood's penalties are kept;
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
	DefaultMaxFirstWaiting = 256
	DefaultFirstWait       = 8 * time.Second
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
	// MaxWaiting is how many checks may wait for one of those; past it, a check takes the place of one in no
	// better standing, or is refused.
	MaxWaiting int
	// FailureBurst is how many failed checks a client may make in a row; after that, one per FailureInterval.
	FailureBurst    int
	FailureInterval time.Duration
	// MaxClients is how many clients' budgets are remembered, besides those with a check running or waiting (at
	// most MaxConcurrent + MaxWaiting + MaxFirstWaiting). Past it, an eighth of them, those in the best standing, are
	// forgotten.
	MaxClients int
	// MaxFirstWaiting is how many first attempts of clients in the best standing (none of the budget spent, not
	// refused lately) may wait besides MaxWaiting, in a line behind them, rather than be refused; FirstWait is how
	// long one may wait there before it is refused, less than a scraper's timeout, so that it is refused on its
	// connection, where asked again it goes first; a check whose context has a deadline is refused a second before
	// it, if that is sooner.
	MaxFirstWaiting int
	FirstWait       time.Duration
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
	line    []*waiter                        // first attempts in the best standing with no room in waiting
	seq     uint64                           // of the last check to wait
	valid   map[credential][sha256.Size]byte // user and hash: the digest of the password that matched
	flights map[flightKey]*flight
	clients map[string]*client
	// Checks refused (ErrBusy) since the Checker was made, by reason: the client's bounds, or all clients' together.
	refusedClient, refusedBusy uint64
}

var refusedDesc = prometheus.NewDesc("gpu_pod_exporter_basic_auth_refused_total",
	"Requests answered 429 without a password check, by reason: client (its budget of failed checks is spent, or it has "+
		"a check of the kind in flight), busy (as many checks wait for bcrypt as may, all in better standing, or a newer "+
		"one in no worse standing took its place, or it waited as long as a first attempt may).", []string{"reason"}, nil)

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

// conn is what is known of one connection: the password last refused on it before it could be checked. Its fields
// are the Checker's, under its mutex.
type conn struct {
	refused    flightKey
	hasRefused bool
}

type connKey struct{}

// ConnContext returns ctx carrying the state of a new connection, for http.Server's ConnContext: the requests of
// the connection pass it to Check in their contexts. It costs one small allocation per connection, freed with it,
// so what is remembered of connections is bounded by the server's connection limit.
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &conn{})
}

// lane is a kind of check, each with its own check in flight per client: a first attempt, or a password asked
// again on its connection.
type lane int

const (
	firstAttempt lane = iota
	askedAgain
)

// client is what is known of one client address: its budget of failed checks, how many of its requests were refused
// lately, and whether it has a check of each lane in flight.
type client struct {
	tokens   float64   // whole failed checks left, at most FailureBurst; down to -1 when overdrawn
	refused  float64   // requests refused (429), each counted 1 and halving every FailureInterval
	at       time.Time // when tokens and refused were last brought up to date
	inFlight [2]bool   // by lane
}

// waiter is a check waiting for bcrypt. It is told on turn whether it got a slot (true) or lost its place (false).
type waiter struct {
	standing standing // its client's, when it came
	seq      uint64
	since    time.Time // when it came
	deadline time.Time // its request's, if it has one
	turn     chan bool
	client   *client
	lane     lane
	conn     *conn // nil: none known
	key      flightKey
}

// standing is a check's place in the queue: whether it asks again on its connection for a password refused there
// before it could be checked, its client's whole failed checks left, then its client's refusals lately in powers of
// two (0 for none, or one over an interval ago; 1 for one lately; 2 for two or three...).
type standing struct {
	again   bool
	tokens  int
	refused int
}

func (cl *client) standing(again bool) standing {
	return standing{again: again, tokens: int(math.Floor(cl.tokens)), refused: int(math.Log2(2*cl.refused + 1))}
}

// above reports whether s is the better standing.
func (s standing) above(o standing) bool {
	switch {
	case s.again != o.again:
		return s.again
	case s.tokens != o.tokens:
		return s.tokens > o.tokens
	}
	return s.refused < o.refused
}

// before reports whether w goes before o: better standing, then the newer.
func (w *waiter) before(o *waiter) bool {
	if w.standing != o.standing {
		return w.standing.above(o.standing)
	}
	return w.seq > o.seq
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
	if cfg.MaxFirstWaiting <= 0 {
		cfg.MaxFirstWaiting = DefaultMaxFirstWaiting
	}
	if cfg.FirstWait <= 0 {
		cfg.FirstWait = DefaultFirstWait
	}
	if cfg.Compare == nil {
		cfg.Compare = bcrypt.CompareHashAndPassword
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand panics rather than return an error)
	return &Checker{
		cfg: cfg, key: key,
		valid: map[credential][sha256.Size]byte{}, flights: map[flightKey]*flight{}, clients: map[string]*client{},
	}
}

// Check reports whether password is user's. hash is user's bcrypt hash, "" when there is no such user (then the
// answer is false, after as much work as a wrong password). clientAddr is where the request comes from (host:port or
// host), the unit of the per-client bounds; ctx is the request's, carrying its connection's state (ConnContext),
// without which every check is a first attempt. The error is ErrBusy when the check was refused, or ctx's error when
// the client went away first; either way no answer was reached.
func (c *Checker) Check(ctx context.Context, clientAddr, user, hash, password string) (bool, error) {
	if err := ctx.Err(); err != nil { // an HTTP/2 stream reset as it was sent, a client that hung up
		return false, err
	}
	known := hash != ""
	if !known {
		hash = fakeHash
	}
	key := flightKey{credential{user, hash}, c.digest(password)}
	cn, _ := ctx.Value(connKey{}).(*conn)
	for {
		c.mu.Lock()
		if want, ok := c.valid[key.credential]; ok && known && hmac.Equal(want[:], key.digest[:]) {
			c.mu.Unlock()
			return true, nil
		}
		f, ok := c.flights[key]
		if !ok {
			return c.lead(ctx, clientAddr, cn, key, password, known) // unlocks c.mu
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
func (c *Checker) lead(ctx context.Context, clientAddr string, cn *conn, key flightKey, password string, known bool) (bool, error) {
	cl := c.client(clientAddr)
	// A password asked again on its connection may overdraw the budget by one: the flood that spent it may be
	// another client behind the same address.
	again := cn != nil && cn.hasRefused && cn.refused == key
	ln, floor := firstAttempt, 1.0
	if again {
		ln, floor = askedAgain, 0
	}
	if cl.inFlight[ln] || cl.tokens < floor {
		c.refusedClient++
		c.refuse(cl, cn, key)
		c.mu.Unlock()
		return false, ErrBusy
	}
	var w *waiter
	if c.running >= c.cfg.MaxConcurrent {
		w = &waiter{standing: cl.standing(again), client: cl, lane: ln, conn: cn, key: key}
		w.deadline, _ = ctx.Deadline()
		if !c.wait(w) {
			c.refusedBusy++
			c.refuse(cl, cn, key)
			c.mu.Unlock()
			return false, ErrBusy
		}
	} else {
		c.running++
	}
	cl.inFlight[ln] = true
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.mu.Unlock()

	slot := w == nil || c.await(ctx, w) // without a slot, the waiter has left its lane
	ok, err := false, ctx.Err()
	if slot && err == nil {
		ok = c.cfg.Compare([]byte(key.hash), []byte(password)) == nil
	}

	c.mu.Lock()
	delete(c.flights, key)
	switch {
	case !slot && err == nil: // its place was taken
		err = ErrBusy
	case !slot:
	default:
		c.release()
		cl.inFlight[ln] = false
		if err != nil {
			break
		}
		if cn != nil && cn.refused == key {
			cn.hasRefused = false
		}
		if ok && known {
			if len(c.valid) >= maxRemembered {
				clear(c.valid) // only a web configuration with that many users, or changed that often, fills it
			}
			c.valid[key.credential] = key.digest
		} else {
			cl.tokens--
		}
	}
	f.ok, f.err = ok && known, err
	c.mu.Unlock()
	close(f.done)
	return f.ok, f.err
}

// refuse notes a request of cl for key refused without a check: the client's refusals lately, and the password on
// its connection, so that asked again there it goes first. c.mu is held.
func (c *Checker) refuse(cl *client, cn *conn, key flightKey) {
	cl.refused++
	if cn != nil {
		cn.refused, cn.hasRefused = key, true
	}
}

// wait queues w for the next free slot: in the room left, or in the place of the newest waiting check of the lowest
// standing when w's is no lower, which then leaves its lane and is told it lost its place. Taking the newest's place
// rather than the oldest's, a burst of first attempts of equal standing (a flood's, as a restarted exporter begins
// to listen) churns one place: the newest is still checked next, and the checks that came before the burst filled
// the queue, a scraper's among them, keep their places until it ends. It reports whether w waits. c.mu is held.
func (c *Checker) wait(w *waiter) bool {
	c.seq++
	w.seq, w.turn, w.since = c.seq, make(chan bool, 1), c.cfg.Now()
	c.shed(w.since)
	if len(c.waiting) >= c.cfg.MaxWaiting {
		victim := 0
		for i, o := range c.waiting {
			if v := c.waiting[victim]; v.standing.above(o.standing) || v.standing == o.standing && o.seq > v.seq {
				victim = i
			}
		}
		if c.waiting[victim].standing.above(w.standing) {
			return c.queueFirst(w, w.since)
		}
		displaced := c.waiting[victim]
		c.waiting = slices.Delete(c.waiting, victim, victim+1)
		if !c.queueFirst(displaced, w.since) {
			c.drop(displaced)
		}
	}
	c.waiting = append(c.waiting, w)
	return true
}

// queueFirst puts w in the line of first attempts, if it is one in the best standing, there is room, and its time
// in the line is not up; it reports whether it did. c.mu is held.
func (c *Checker) queueFirst(w *waiter, now time.Time) bool {
	best := standing{tokens: c.cfg.FailureBurst}
	if w.standing != best || len(c.line) >= c.cfg.MaxFirstWaiting || !now.Before(c.lineEnd(w)) {
		return false
	}
	c.line = append(c.line, w)
	return true
}

// lineEnd is when w's time in the line is up: FirstWait after it came, or a second before its request's deadline
// if that is sooner. Refused then, a scraper's password goes first when asked again on its connection, whereas
// waiting on would end with its scrape's timeout, and its connection.
func (c *Checker) lineEnd(w *waiter) time.Time {
	end := w.since.Add(c.cfg.FirstWait)
	if d := w.deadline.Add(-lineMargin); !w.deadline.IsZero() && d.Before(end) {
		end = d
	}
	return end
}

// lineMargin is how long before its request's deadline a first attempt in the line is refused, for the answer to
// reach its client in time: the line is shed as checks come and end, tens of milliseconds apart under a flood.
const lineMargin = time.Second

// shed refuses the first attempts whose time in the line is up. c.mu is held.
func (c *Checker) shed(now time.Time) {
	c.line = slices.DeleteFunc(c.line, func(w *waiter) bool {
		if now.Before(c.lineEnd(w)) {
			return false
		}
		c.drop(w)
		return true
	})
}

// drop refuses w, which has left waiting or the line, and tells it it lost its place. c.mu is held.
func (c *Checker) drop(w *waiter) {
	c.refusedBusy++
	w.client.inFlight[w.lane] = false
	c.refuse(w.client, w.conn, w.key)
	w.turn <- false
}

// await waits for w's turn, unless ctx ends first; it reports whether w holds a slot now. Without one, w has left
// its lane, so that a client's checks in flight are those running or waiting whenever c.mu is free.
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
		w.client.inFlight[w.lane] = false
		return false
	}
	if i := slices.Index(c.line, w); i >= 0 {
		c.line = slices.Delete(c.line, i, i+1)
		w.client.inFlight[w.lane] = false
		return false
	}
	// Given a slot or its place taken as ctx ended: a slot is handed on.
	if <-w.turn {
		c.release()
		w.client.inFlight[w.lane] = false
	}
	return false
}

// release ends a bcrypt check: its slot goes to the waiting check that goes first, or, when none waits in the best
// standing of first attempts or better, to the newest in the line of first attempts. c.mu is held.
func (c *Checker) release() {
	c.shed(c.cfg.Now())
	first := 0
	for i, w := range c.waiting {
		if w.before(c.waiting[first]) {
			first = i
		}
	}
	var w *waiter
	switch {
	case len(c.line) > 0 && (len(c.waiting) == 0 || c.line[0].standing.above(c.waiting[first].standing)):
		w = c.line[len(c.line)-1]
		c.line = c.line[:len(c.line)-1]
	case len(c.waiting) > 0:
		w = c.waiting[first]
		c.waiting = slices.Delete(c.waiting, first, first+1)
	default:
		c.running--
		return
	}
	w.turn <- true
}

// client returns the budget of the client at addr, brought up to date. c.mu is held.
func (c *Checker) client(addr string) *client {
	now := c.cfg.Now()
	id := clientID(addr)
	cl, ok := c.clients[id]
	if !ok {
		if len(c.clients) >= c.cfg.MaxClients {
			c.forget(now)
		}
		cl = &client{tokens: float64(c.cfg.FailureBurst), at: now}
		c.clients[id] = cl
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

// forget forgets an eighth of the clients, those in the best standing, none with a check in flight: such a client
// comes back new, which is the best standing, so forgetting it gives nothing away, while the clients that failed or
// were refused most keep their penalties. Once in MaxClients/8 new clients, it costs a sort of the clients. c.mu is
// held.
func (c *Checker) forget(now time.Time) {
	type rested struct {
		id string
		s  standing
	}
	idle := make([]rested, 0, len(c.clients))
	for id, cl := range c.clients {
		c.refill(cl, now)
		if cl.inFlight == [2]bool{} {
			idle = append(idle, rested{id, cl.standing(false)})
		}
	}
	slices.SortFunc(idle, func(a, b rested) int {
		switch {
		case a.s.above(b.s):
			return -1
		case b.s.above(a.s):
			return 1
		}
		return 0
	})
	drop := len(c.clients) - c.cfg.MaxClients + max(1, c.cfg.MaxClients/8)
	for _, r := range idle[:min(len(idle), drop)] {
		delete(c.clients, r.id)
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
