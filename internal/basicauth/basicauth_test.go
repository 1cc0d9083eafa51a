package basicauth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/bcrypt"
)

// fakeBcrypt stands in for bcrypt: a "hash" is "hash-of-<password>". It counts its calls and the most running at
// once, notes the passwords in the order checked, and while gate is non-nil each call waits for gate to close.
type fakeBcrypt struct {
	mu             sync.Mutex
	calls, running int
	most           int
	order          []string
	gate           chan struct{}
}

func (f *fakeBcrypt) compare(hash, password []byte) error {
	f.mu.Lock()
	f.calls++
	f.order = append(f.order, string(password))
	f.running++
	f.most = max(f.most, f.running)
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	f.running--
	f.mu.Unlock()
	if string(hash) != "hash-of-"+string(password) {
		return bcrypt.ErrMismatchedHashAndPassword
	}
	return nil
}

func (f *fakeBcrypt) count() (calls, most int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.most
}

const hash = "hash-of-s3cret"

func check(t *testing.T, c *Checker, client, password string) (bool, error) {
	t.Helper()
	return c.Check(context.Background(), client, "prometheus", hash, password)
}

// connection returns the context the server gives the requests of one new connection.
func connection() context.Context { return ConnContext(context.Background(), nil) }

// slowBcrypt is fakeBcrypt taking 70 ms a check, as bcrypt at cost 10 does on one core.
func slowBcrypt(f *fakeBcrypt) func(hash, password []byte) error {
	return func(hash, password []byte) error {
		time.Sleep(70 * time.Millisecond)
		return f.compare(hash, password)
	}
}

// flood starts one attacker on a connection of its own from each address, asking with a new wrong password pause
// after each answer, until stop is called; stop returns how many it sent.
func flood(c *Checker, addrs []string, pause time.Duration) (stop func() int64) {
	return staggeredFlood(c, addrs, pause, 0)
}

// staggeredFlood is flood with the attackers starting stagger apart, as their TLS handshakes spread them when a
// restarted exporter begins to listen.
func staggeredFlood(c *Checker, addrs []string, pause, stagger time.Duration) (stop func() int64) {
	var attackers sync.WaitGroup
	var guesses atomic.Int64
	var cancels []context.CancelFunc
	for i, addr := range addrs {
		ctx, cancel := context.WithCancel(connection())
		cancels = append(cancels, cancel)
		attackers.Go(func() {
			time.Sleep(time.Duration(i) * stagger)
			for ctx.Err() == nil {
				c.Check(ctx, addr, "prometheus", hash, fmt.Sprint("guess-", guesses.Add(1)))
				time.Sleep(pause)
			}
		})
	}
	return func() int64 {
		for _, cancel := range cancels {
			cancel()
		}
		attackers.Wait()
		return guesses.Load()
	}
}

// floodAddrs are n attacking addresses.
func floodAddrs(n int) []string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.1.%d.%d:1", i/250, i%250)
	}
	return addrs
}

// scrape asks like Prometheus, from addr on one keep-alive connection: n times, every interval, each with a 10 s
// timeout. It returns the scrapes that failed, and how long the first took.
func scrape(c *Checker, addr string, n int, every time.Duration) (failed []string, firstTook time.Duration) {
	conn := connection()
	for i := range n {
		ctx, cancel := context.WithTimeout(conn, 10*time.Second)
		start := time.Now()
		ok, err := c.Check(ctx, addr, "prometheus", hash, "s3cret")
		cancel()
		if i == 0 {
			firstTook = time.Since(start)
		}
		if !ok {
			failed = append(failed, fmt.Sprintf("scrape %d: %v, %v", i, ok, err))
		}
		time.Sleep(every)
	}
	return failed, firstTook
}

// waitingChecks starts checks of wrong passwords from new clients, one at a time, and returns once each runs or
// waits for bcrypt.
func waitingChecks(t *testing.T, c *Checker, passwords ...string) {
	for i, p := range passwords {
		go check(t, c, fmt.Sprintf("10.0.0.%d:1", 100+i), p)
		synctest.Wait()
	}
}

// checked returns the passwords checked by bcrypt, in order, once every check has ended.
func (f *fakeBcrypt) checked() []string {
	synctest.Wait()
	close(f.gate)
	synctest.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.order
}

// A right password is checked once and then remembered; a wrong one and an unknown user are checked each time.
func TestRightPasswordIsRemembered(t *testing.T) {
	f := &fakeBcrypt{}
	c := New(Config{Compare: f.compare})
	for range 3 {
		if ok, err := check(t, c, "10.0.0.1:5000", "s3cret"); !ok || err != nil {
			t.Fatalf("right password: %v, %v", ok, err)
		}
	}
	if calls, _ := f.count(); calls != 1 {
		t.Errorf("%d checks of a right password made 3 times, want 1", calls)
	}
	if ok, err := check(t, c, "10.0.0.1:5000", "guess"); ok || err != nil {
		t.Errorf("wrong password: %v, %v", ok, err)
	}
	if ok, err := c.Check(context.Background(), "10.0.0.1:5000", "nobody", "", "s3cret"); ok || err != nil {
		t.Errorf("unknown user: %v, %v", ok, err)
	}
	if calls, _ := f.count(); calls != 3 {
		t.Errorf("%d checks, want 3: a wrong password and an unknown user each cost one", calls)
	}
	// The remembered password belongs to its hash: a new hash (a changed configuration) is checked again.
	if ok, _ := c.Check(context.Background(), "10.0.0.1:5000", "prometheus", "hash-of-other", "s3cret"); ok {
		t.Error("the remembered password was accepted for another hash")
	}
}

// A client out of failed checks is refused at once, without bcrypt, and gets one more check per interval; other
// clients keep theirs, and a right password already remembered is still accepted from the refused client.
func TestFailureBudgetPerClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{}
		c := New(Config{Compare: f.compare, FailureBurst: 3, FailureInterval: 10 * time.Second})
		if ok, _ := check(t, c, "10.0.0.1:1", "s3cret"); !ok {
			t.Fatal("right password refused")
		}
		for i := range 3 {
			if ok, err := check(t, c, fmt.Sprintf("10.0.0.1:%d", 100+i), "guess"); ok || err != nil {
				t.Fatalf("failed check %d: %v, %v", i, ok, err)
			}
		}
		before, _ := f.count()
		if _, err := check(t, c, "10.0.0.1:200", "guess"); !errors.Is(err, ErrBusy) {
			t.Errorf("a 4th failed check: %v, want ErrBusy", err)
		}
		if ok, err := check(t, c, "10.0.0.1:201", "s3cret"); !ok || err != nil {
			t.Errorf("the remembered right password from the same client: %v, %v", ok, err)
		}
		if ok, err := check(t, c, "10.0.0.2:1", "guess"); ok || err != nil {
			t.Errorf("another client: %v, %v", ok, err)
		}
		if after, _ := f.count(); after != before+1 {
			t.Errorf("%d bcrypt checks after the budget ran out, want 1 (the other client's)", after-before)
		}
		time.Sleep(10 * time.Second)
		if _, err := check(t, c, "10.0.0.1:300", "guess"); err != nil {
			t.Errorf("after the interval: %v, want one more check", err)
		}
		if _, err := check(t, c, "10.0.0.1:301", "guess"); !errors.Is(err, ErrBusy) {
			t.Errorf("a second check after one interval: %v, want ErrBusy", err)
		}
		checkRefusals(t, c, 2, 0)
	})
}

// checkRefusals compares the Checker's self-metrics with the checks it refused.
func checkRefusals(t *testing.T, c *Checker, client, busy int) {
	t.Helper()
	want := fmt.Sprintf(`# HELP gpu_pod_exporter_basic_auth_refused_total %s
# TYPE gpu_pod_exporter_basic_auth_refused_total counter
gpu_pod_exporter_basic_auth_refused_total{reason="busy"} %d
gpu_pod_exporter_basic_auth_refused_total{reason="client"} %d
`, "Requests answered 429 without a password check, by reason: client (its budget of failed checks is spent, or it "+
		"has a check of the kind in flight), busy (as many checks wait for bcrypt as may, all in better standing, or a "+
		"newer one in no worse standing took its place, or it waited as long as a first attempt may).", busy, client)
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// No bcrypt runs for a client that has gone, whether it went before its check or while waiting for a slot.
func TestNoWorkForAClientThatHasGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{gate: make(chan struct{})}
		c := New(Config{Compare: f.compare, MaxConcurrent: 1})
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.Check(gone, "10.0.0.1:1", "prometheus", hash, "guess"); !errors.Is(err, context.Canceled) {
			t.Errorf("gone before the check: %v", err)
		}

		go check(t, c, "10.0.0.2:1", "guess") // holds the one slot
		synctest.Wait()
		leaving, leave := context.WithCancel(context.Background())
		errc := make(chan error)
		go func() {
			_, err := c.Check(leaving, "10.0.0.3:1", "prometheus", hash, "other")
			errc <- err
		}()
		synctest.Wait()
		leave()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("gone while waiting: %v", err)
		}
		close(f.gate)
		synctest.Wait()
		if calls, _ := f.count(); calls != 1 {
			t.Errorf("%d bcrypt checks, want 1 (the one holding the slot)", calls)
		}
	})
}

// At most MaxConcurrent checks run, MaxWaiting wait and MaxFirstWaiting first attempts wait behind them; more are
// refused. Identical checks share one.
func TestConcurrentChecksAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{gate: make(chan struct{})}
		c := New(Config{Compare: f.compare, MaxConcurrent: 2, MaxWaiting: 3, MaxFirstWaiting: 4})
		var busy, done atomic.Int32
		for i := range 20 {
			go func() {
				_, err := check(t, c, fmt.Sprintf("10.0.1.%d:1", i), fmt.Sprintf("guess-%d", i))
				if errors.Is(err, ErrBusy) {
					busy.Add(1)
				}
				done.Add(1)
			}()
			synctest.Wait()
		}
		// The same wrong password as the first client's, from 10 more clients: they wait for its answer.
		for i := range 10 {
			go check(t, c, fmt.Sprintf("10.0.2.%d:1", i), "guess-0")
		}
		synctest.Wait()
		if got := busy.Load(); got != 11 {
			t.Errorf("%d checks refused, want 11 (2 running, 3 waiting, 4 in the line of first attempts)", got)
		}
		close(f.gate)
		synctest.Wait()
		calls, most := f.count()
		if calls != 9 || most != 2 {
			t.Errorf("%d bcrypt checks, at most %d at once; want 9 and 2", calls, most)
		}
		checkRefusals(t, c, 0, 11)
	})
}

// An identical check whose first client leaves is made again for the one still waiting.
func TestSharedCheckOutlivesItsFirstClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{gate: make(chan struct{})}
		c := New(Config{Compare: f.compare, MaxConcurrent: 1})
		go check(t, c, "10.0.0.9:1", "guess") // holds the slot
		synctest.Wait()
		first, leave := context.WithCancel(context.Background())
		go c.Check(first, "10.0.0.1:1", "prometheus", hash, "s3cret")
		synctest.Wait()
		result := make(chan bool)
		go func() {
			ok, _ := check(t, c, "10.0.0.2:1", "s3cret")
			result <- ok
		}()
		synctest.Wait()
		leave()
		synctest.Wait()
		close(f.gate)
		if !<-result {
			t.Error("the waiting client's right password was not accepted after the first client left")
		}
	})
}

// Past MaxClients, the clients in the best standing are forgotten, not those that spent their budget: a new client
// gets a budget of its own, and a client that spent its budget is still refused.
func TestClientsAreBounded(t *testing.T) {
	f := &fakeBcrypt{}
	c := New(Config{Compare: f.compare, MaxClients: 8, FailureBurst: 2, FailureInterval: time.Hour})
	for i := range 8 {
		addr := fmt.Sprintf("10.0.0.%d:1", i)
		if i < 4 { // spent
			check(t, c, addr, "guess")
			check(t, c, addr, "guess")
		} else {
			check(t, c, addr, "s3cret")
		}
	}
	for i := range 20 {
		if _, err := check(t, c, fmt.Sprintf("10.0.1.%d:1", i), "guess"); err != nil {
			t.Errorf("new client %d past the bound: %v, want its own budget", i, err)
		}
		if len(c.clients) > 8 {
			t.Fatalf("%d clients remembered, want at most 8", len(c.clients))
		}
	}
	for i := range 4 {
		if _, err := check(t, c, fmt.Sprintf("10.0.0.%d:1", i), "guess"); !errors.Is(err, ErrBusy) {
			t.Errorf("client %d, whose budget is spent, after 20 new clients: %v, want ErrBusy", i, err)
		}
	}
}

// An exporter restarted under a flood of wrong passwords from 200 addresses, each asking again 10 ms after every
// answer, has remembered no password yet. The flood's first attempts come at once, or spread over 400-500 ms by
// their TLS handshakes, and cannot be told from Prometheus's. Whether Prometheus's first scrape comes among the
// first of them, in their middle or after them, it is checked within its 10 s timeout and the line's 8 s (in the
// middle of 200, at 70 ms a check, it waits 7.6 s), and every scrape succeeds.
func TestRightPasswordGetsThroughAFloodAfterARestart(t *testing.T) {
	for _, tc := range []struct {
		name           string
		stagger, delay time.Duration // between the attackers' first attempts; before Prometheus's first scrape
	}{
		{"just after a burst", 0, 0},
		{"300 ms after a burst", 0, 300 * time.Millisecond},
		{"third in a 400 ms burst", 2 * time.Millisecond, 3 * time.Millisecond},
		{"after a 400 ms burst", 2 * time.Millisecond, 500 * time.Millisecond},
		{"in the middle of a 500 ms burst", 2500 * time.Microsecond, 250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeBcrypt{}
				c := New(Config{Compare: slowBcrypt(f), MaxConcurrent: 1})
				stop := staggeredFlood(c, floodAddrs(200), 10*time.Millisecond, tc.stagger)
				synctest.Wait()
				time.Sleep(tc.delay)
				failed, firstTook := scrape(c, "10.9.9.9:4000", 10, 500*time.Millisecond)
				guesses := stop()
				calls, _ := f.count()
				t.Logf("%d wrong passwords sent, %d checked; Prometheus's first check took %v", guesses, calls, firstTook)
				if len(failed) > 0 || firstTook > 8*time.Second {
					t.Errorf("Prometheus's scrapes failed: %q; the first took %v", failed, firstTook)
				}
			})
		})
	}
}

// Among checks of equal standing the newest goes first, and when there is no room a new one takes the place of the
// newest waiting, which waits in the line of first attempts behind them: through a burst of first attempts the
// newest is checked next, the first to come keep their places and are checked when the burst ends, and then the
// line.
func TestNewestFirstAmongEqualStanding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{gate: make(chan struct{})}
		c := New(Config{Compare: f.compare, MaxConcurrent: 1, MaxWaiting: 2})
		waitingChecks(t, c, "running", "oldest", "newer") // one running, two waiting
		result := make(chan bool)
		go func() {
			ok, _ := check(t, c, "10.9.9.9:1", "s3cret")
			result <- ok
		}()
		if order := f.checked(); !slices.Equal(order, []string{"running", "s3cret", "oldest", "newer"}) {
			t.Errorf("checked %q, want the newest first, the first to come next and the newest waiting last", order)
		}
		if !<-result {
			t.Error("the scraper's first attempt was not accepted")
		}
		checkRefusals(t, c, 0, 0)
	})
}

// A password refused on a connection before it could be checked, asked again on the same connection, may be checked
// while its client's budget is spent (the flood that spent it may share the scraper's address), and goes before
// first attempts of any standing; asked on another connection, it is a first attempt. Once checked it has no such
// place.
func TestPasswordAskedAgainGoesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{}
		c := New(Config{Compare: f.compare, MaxConcurrent: 1, MaxWaiting: 2, FailureBurst: 1, FailureInterval: time.Hour})
		check(t, c, "10.0.9.9:1", "guess") // an attacker spends the address's budget
		f.gate = make(chan struct{})
		waitingChecks(t, c, "running", "oldest", "newer")
		scraper := connection()
		if _, err := c.Check(scraper, "10.0.9.9:2", "prometheus", hash, "s3cret"); !errors.Is(err, ErrBusy) {
			t.Fatalf("the scraper's first ask from the spent address: %v, want ErrBusy", err)
		}
		if _, err := c.Check(connection(), "10.0.9.9:3", "prometheus", hash, "s3cret"); !errors.Is(err, ErrBusy) {
			t.Fatalf("the same password on another connection: %v, want ErrBusy", err)
		}
		result := make(chan bool)
		go func() {
			ok, _ := c.Check(scraper, "10.0.9.9:2", "prometheus", hash, "s3cret")
			result <- ok
		}()
		if order := f.checked(); !slices.Equal(order, []string{"guess", "running", "s3cret", "oldest", "newer"}) {
			t.Errorf("checked %q, want the password asked again before the first attempts", order)
		}
		if !<-result {
			t.Error("the scraper's password, asked again, was not accepted")
		}
		if ok, err := c.Check(connection(), "10.0.9.9:4", "prometheus", hash, "s3cret"); !ok || err != nil {
			t.Errorf("the remembered password on a new connection: %v, %v", ok, err)
		}
		checkRefusals(t, c, 2, 0)
	})
}

// A wrong password asked again on its connection overdraws a spent budget by one failed check, no more: the budget
// still bounds an attacker that asks twice with each guess.
func TestAskedAgainOverdrawsByOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{}
		c := New(Config{Compare: f.compare, FailureBurst: 2, FailureInterval: 10 * time.Second})
		conn := connection()
		ask := func(password string) error {
			_, err := c.Check(conn, "10.0.0.1:1", "prometheus", hash, password)
			return err
		}
		for i := range 10 { // each guess twice, as fast as answered
			ask(fmt.Sprint("guess-", i))
			ask(fmt.Sprint("guess-", i))
		}
		if calls, _ := f.count(); calls != 3 {
			t.Errorf("%d checks of 10 guesses asked twice each, want 3: the budget of 2 and one overdrawn", calls)
		}
		time.Sleep(10 * time.Second)
		ask("guess-10")
		ask("guess-10")
		ask("guess-11")
		ask("guess-11")
		if calls, _ := f.count(); calls != 4 {
			t.Errorf("%d checks after one interval, want 4: one more", calls)
		}
	})
}

func TestBcrypt(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	c := New(Config{})
	if ok, err := c.Check(context.Background(), "10.0.0.1:1", "prometheus", string(h), "s3cret"); !ok || err != nil {
		t.Errorf("right password: %v, %v", ok, err)
	}
	if ok, err := c.Check(context.Background(), "10.0.0.1:1", "prometheus", string(h), "S3cret"); ok || err != nil {
		t.Errorf("wrong password: %v, %v", ok, err)
	}
	if ok, err := c.Check(context.Background(), "10.0.0.1:1", "nobody", "", "s3cret"); ok || err != nil {
		t.Errorf("unknown user: %v, %v", ok, err)
	}
}

func TestClientID(t *testing.T) {
	for addr, want := range map[string]string{
		"10.1.2.3:4567":               "10.1.2.3",
		"[::ffff:10.1.2.3]:4567":      "10.1.2.3",
		"[2001:db8:1:2:3:4:5:6]:9402": "2001:db8:1:2::",
		"[2001:db8:1:2::7]:1":         "2001:db8:1:2::",
		"@":                           "@",
	} {
		if got := clientID(addr); got != want {
			t.Errorf("clientID(%q) = %q, want %q", addr, got, want)
		}
	}
}

// A scraper that shares its address with an attacker (NAT, a shared egress, the same node), seen right after a
// restart, is checked and then remembered: the attacker's spent budget does not refuse a password asked again on
// the scraper's own connection. Alone with the attacker, or with the attacker one of a flood of 200 addresses; 8
// scrapes, 15 s apart.
func TestScraperSharingAnAttackersAddress(t *testing.T) {
	for _, n := range []int{1, 200} {
		t.Run(fmt.Sprintf("%d attacking addresses", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeBcrypt{}
				c := New(Config{Compare: slowBcrypt(f), MaxConcurrent: 1})
				stop := flood(c, floodAddrs(n), 10*time.Millisecond)
				synctest.Wait()
				failed, _ := scrape(c, "10.1.0.0:4000", 8, 15*time.Second) // attacker 0's address
				guesses := stop()
				calls, _ := f.count()
				t.Logf("%d wrong passwords sent, %d checked; %d of 8 scrapes failed", guesses, calls, len(failed))
				if len(failed) > 1 {
					t.Errorf("%d of 8 scrapes failed, want at most the first: %q", len(failed), failed)
				}
			})
		})
	}
}

// More attacking addresses than MaxClients (4,096: a /48 of IPv6 /64s, a botnet), here 50 for 16: a scraper first
// seen after them (a restarted Prometheus pod with a new address, an HA replica) gets a budget of its own, and from
// its second scrape at the latest is checked first; 8 scrapes, 15 s apart.
func TestScraperNewAfterMoreAttackersThanMaxClients(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{}
		c := New(Config{Compare: slowBcrypt(f), MaxConcurrent: 1, MaxClients: 16, MaxFirstWaiting: 8})
		stop := flood(c, floodAddrs(50), 10*time.Millisecond)
		time.Sleep(10 * time.Second) // every address has asked, many times
		failed, _ := scrape(c, "10.9.9.9:4000", 8, 15*time.Second)
		guesses := stop()
		calls, _ := f.count()
		t.Logf("%d wrong passwords sent, %d checked; %d of 8 scrapes failed", guesses, calls, len(failed))
		if len(failed) > 1 {
			t.Errorf("%d of 8 scrapes failed, want at most the first: %q", len(failed), failed)
		}
		if len(c.clients) > 16+1+8+8 {
			t.Errorf("%d clients remembered, want at most 33: 16, and those with a check running or waiting", len(c.clients))
		}
	})
}

// A first attempt in the line is refused once it has waited FirstWait, or a second before its request's deadline if
// that is sooner: before its scraper gives up, so that asked again on its connection it goes first.
func TestFirstAttemptWaitsAtMostFirstWait(t *testing.T) {
	for _, tc := range []struct {
		name            string
		timeout, refuse time.Duration // the scrape's (0 for none); when it is refused
		stillInLine     []string      // the first attempts without a deadline not yet shed with it, newest first
	}{
		{"no deadline", 0, 8 * time.Second, nil},
		{"a 20 s deadline", 20 * time.Second, 8 * time.Second, nil},
		{"a 5 s deadline", 5 * time.Second, 4 * time.Second, []string{"newer", "waiting"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeBcrypt{gate: make(chan struct{})}
				c := New(Config{Compare: f.compare, MaxConcurrent: 1, MaxWaiting: 1, FirstWait: 8 * time.Second})
				waitingChecks(t, c, "running", "waiting")
				scraper := connection()
				scrape := func() (bool, error) {
					ctx, cancel := scraper, context.CancelFunc(func() {})
					if tc.timeout > 0 {
						ctx, cancel = context.WithTimeout(scraper, tc.timeout)
					}
					defer cancel()
					return c.Check(ctx, "10.9.9.9:1", "prometheus", hash, "s3cret")
				}
				start := time.Now()
				errc := make(chan error)
				go func() {
					_, err := scrape() // takes the place of "waiting", which goes to the line, then goes there itself
					errc <- err
				}()
				synctest.Wait()
				go check(t, c, "10.0.0.50:1", "newer")
				synctest.Wait()
				time.Sleep(tc.refuse - time.Millisecond)
				go check(t, c, "10.0.0.51:1", "early") // the line is shed as a check comes or ends
				synctest.Wait()
				select {
				case err := <-errc:
					t.Fatalf("the first attempt in the line: %v after %v, before its time", err, time.Since(start))
				default:
				}
				time.Sleep(time.Millisecond)
				go check(t, c, "10.0.0.52:1", "newest")
				if err := <-errc; !errors.Is(err, ErrBusy) || time.Since(start) != tc.refuse {
					t.Errorf("the first attempt in the line: %v after %v, want ErrBusy after %v", err, time.Since(start),
						tc.refuse)
				}
				result := make(chan bool)
				go func() {
					ok, _ := scrape()
					result <- ok
				}()
				want := append([]string{"running", "s3cret", "newest", "early"}, tc.stillInLine...)
				if order := f.checked(); !slices.Equal(order, want) {
					t.Errorf("checked %q, want %q: the password asked again first, the newest next, then the line, "+
						"newest first, and those shed from it not at all", order, want)
				}
				if !<-result {
					t.Error("the scraper's password, asked again, was not accepted")
				}
			})
		})
	}
}
