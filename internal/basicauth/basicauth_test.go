package basicauth

import (
	"context"
	"errors"
	"fmt"
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
// once, and while gate is non-nil each call waits for gate to close.
type fakeBcrypt struct {
	mu             sync.Mutex
	calls, running int
	most           int
	gate           chan struct{}
}

func (f *fakeBcrypt) compare(hash, password []byte) error {
	f.mu.Lock()
	f.calls++
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
		"has a check in flight), busy (as many checks wait for bcrypt as may, from clients in no worse standing, or one in "+
		"better standing took its place).", busy, client)
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

// At most MaxConcurrent checks run and MaxWaiting wait; more are refused. Identical checks share one.
func TestConcurrentChecksAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{gate: make(chan struct{})}
		c := New(Config{Compare: f.compare, MaxConcurrent: 2, MaxWaiting: 3})
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
		if got := busy.Load(); got != 15 {
			t.Errorf("%d checks refused, want 15 (2 running, 3 waiting)", got)
		}
		close(f.gate)
		synctest.Wait()
		calls, most := f.count()
		if calls != 5 || most != 2 {
			t.Errorf("%d bcrypt checks, at most %d at once; want 5 and 2", calls, most)
		}
		checkRefusals(t, c, 0, 15)
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

// Past MaxClients, clients whose budget is full are forgotten; when none is, new clients share one budget.
func TestClientsAreBounded(t *testing.T) {
	f := &fakeBcrypt{}
	c := New(Config{Compare: f.compare, MaxClients: 4, FailureBurst: 2, FailureInterval: time.Hour})
	for i := range 4 {
		check(t, c, fmt.Sprintf("10.0.0.%d:1", i), "guess")
	}
	for i := range 3 {
		_, err := check(t, c, fmt.Sprintf("10.0.1.%d:1", i), "guess")
		if want := i == 2; errors.Is(err, ErrBusy) != want {
			t.Errorf("new client %d past the bound: %v, want ErrBusy %v", i, err, want)
		}
	}
	if len(c.clients) != 4 {
		t.Errorf("%d clients remembered, want 4", len(c.clients))
	}
}

// An exporter restarted under a flood of wrong passwords from 200 addresses, each asking again 10 ms after every
// answer, has remembered no password yet. Prometheus's first scrape may be refused only while the first attempts of
// those addresses fill the queue, which it cannot be told from; every scrape after it must succeed. (Before, every
// scrape got 429: the attackers' checks filled the queue first, and kept filling it.)
func TestRightPasswordGetsThroughAFloodAfterARestart(t *testing.T) {
	for _, delay := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("first scrape %v into the flood", delay), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeBcrypt{}
				compare := func(hash, password []byte) error {
					time.Sleep(70 * time.Millisecond) // bcrypt at cost 10 on one core
					return f.compare(hash, password)
				}
				c := New(Config{Compare: compare, MaxConcurrent: 1})
				flood, stop := context.WithCancel(context.Background())
				var attackers sync.WaitGroup
				var guesses atomic.Int64
				for i := range 200 {
					attackers.Go(func() {
						for flood.Err() == nil {
							c.Check(flood, fmt.Sprintf("10.1.%d.%d:1", i/250, i%250), "prometheus", hash, fmt.Sprint("guess-", guesses.Add(1)))
							time.Sleep(10 * time.Millisecond)
						}
					})
				}
				synctest.Wait() // every attacker has asked once: the queue is full of them
				time.Sleep(delay)
				var failed []string
				var firstTook time.Duration
				for scrape := range 10 {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					start := time.Now()
					ok, err := c.Check(ctx, "10.9.9.9:4000", "prometheus", hash, "s3cret")
					cancel()
					if scrape == 0 {
						firstTook = time.Since(start)
					}
					if !ok && (scrape > 0 || delay > 0) {
						failed = append(failed, fmt.Sprintf("scrape %d: %v, %v", scrape, ok, err))
					}
					time.Sleep(500 * time.Millisecond)
				}
				stop()
				attackers.Wait()
				calls, _ := f.count()
				t.Logf("%d wrong passwords sent, %d checked; Prometheus's first check took %v", guesses.Load(), calls, firstTook)
				if len(failed) > 0 || delay > 0 && firstTook > time.Second {
					t.Errorf("Prometheus's scrapes failed: %q; the first took %v", failed, firstTook)
				}
			})
		})
	}
}

// A password refused before it could be checked goes first when it is asked again, before the first attempts of
// clients in the same standing: a scraper asks again with its one password, a flood with a new guess. Once checked,
// right or wrong, it has no such place.
func TestPasswordAskedAgainGoesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeBcrypt{gate: make(chan struct{})}
		c := New(Config{Compare: f.compare, MaxConcurrent: 1, MaxWaiting: 2})
		for i := range 3 { // one running, two waiting
			go check(t, c, fmt.Sprintf("10.0.0.%d:1", i), fmt.Sprint("guess-", i))
			synctest.Wait()
		}
		if _, err := check(t, c, "10.0.9.9:1", "s3cret"); !errors.Is(err, ErrBusy) {
			t.Fatalf("the scraper's first ask into a full queue of first attempts: %v, want ErrBusy", err)
		}
		if _, err := check(t, c, "10.0.0.9:1", "guess-9"); !errors.Is(err, ErrBusy) {
			t.Fatalf("another first attempt: %v, want ErrBusy", err)
		}
		result := make(chan bool)
		go func() {
			ok, _ := check(t, c, "10.0.9.9:1", "s3cret")
			result <- ok
		}()
		synctest.Wait()
		if _, err := check(t, c, "10.0.0.10:1", "guess-10"); !errors.Is(err, ErrBusy) {
			t.Errorf("a first attempt after the scraper took a place: %v, want ErrBusy", err)
		}
		f.mu.Lock()
		calls := f.calls
		f.mu.Unlock()
		close(f.gate)
		if !<-result {
			t.Error("the scraper's password, asked again, was not accepted")
		}
		synctest.Wait()
		if got, _ := f.count(); got != calls+2 {
			t.Errorf("%d more checks, want 2: the scraper's, and the one waiting attempt left", got-calls)
		}
		checkRefusals(t, c, 0, 4)
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
