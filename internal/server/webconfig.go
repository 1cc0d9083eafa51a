package server

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/config"
	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v2"
	"golang.org/x/net/http2"
	"golang.org/x/time/rate"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/basicauth"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
)

// The web configuration file (--web.config.file) is exporter-toolkit's: TLS, basic auth, response headers and a rate
// limit, read and checked with its types and functions. The exporter serves it itself rather than through the
// toolkit's server, whose one mutex around bcrypt and 100-entry cache with random eviction let wrong passwords lock
// out right ones: its checks go through basicauth, and HTTP/2 is off unless the file turns it on (the toolkit's
// default is on), since an HTTP/2 client can start a handler per stream far faster than per connection.

// loadWebConfig reads the web configuration file and checks it as exporter-toolkit does: its users' hashes, its
// headers, its TLS files. It has the toolkit's defaults, but HTTP/2 only when the file says http2: true. The file
// and the TLS files it names must be regular files within configfile's cap, which is checked before the toolkit
// reads them.
func loadWebConfig(path string) (*web.Config, error) {
	b, err := configfile.Read(path, configfile.MaxBytes)
	if err != nil {
		return nil, err
	}
	c := &web.Config{TLSConfig: web.TLSConfig{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13}}
	if err := yaml.UnmarshalStrict(b, c); err != nil {
		return nil, err
	}
	c.TLSConfig.SetDirectory(filepath.Dir(path))
	for _, f := range []string{c.TLSConfig.TLSCertPath, c.TLSConfig.TLSKeyPath, c.TLSConfig.ClientCAs} {
		if f == "" {
			continue
		}
		if err := configfile.Check(f, configfile.MaxBytes); err != nil {
			return nil, err
		}
	}
	if err := web.Validate(path); err != nil {
		return nil, err
	}
	return c, nil
}

// tlsFilesRead is t with the files it names read, through configfile, into the fields that hold them inline, so
// that the toolkit makes the TLS configuration from them and reads no file itself.
func tlsFilesRead(t web.TLSConfig) (web.TLSConfig, error) {
	for _, f := range []struct {
		path   *string
		inline func(string)
	}{
		{&t.TLSCertPath, func(s string) { t.TLSCert = s }},
		{&t.TLSKeyPath, func(s string) { t.TLSKey = config.Secret(s) }},
		{&t.ClientCAs, func(s string) { t.ClientCAsText = s }},
	} {
		if *f.path == "" {
			continue
		}
		b, err := configfile.Read(*f.path, configfile.MaxBytes)
		if err != nil {
			return t, err
		}
		f.inline(string(b))
		*f.path = ""
	}
	return t, nil
}

// tlsConfig is the TLS configuration of c, with its files read through configfile.
func tlsConfig(c *web.Config) (*tls.Config, error) {
	t, err := tlsFilesRead(c.TLSConfig)
	if err != nil {
		return nil, err
	}
	return web.ConfigToTLSConfig(&t)
}

// CheckWebConfig checks, before the exporter starts, everything its listeners will need of the web configuration:
// with HTTP/2 on, TLS settings that the HTTP/2 server refuses (cipher suites without one it requires) would
// otherwise pass the toolkit's check and stop the exporter at listen.
func CheckWebConfig(path string) error {
	c, err := loadWebConfig(path)
	if err != nil {
		return err
	}
	if !c.TLSConfig.IsEnabled() || !c.HTTPConfig.HTTP2 {
		return nil
	}
	tc, err := tlsConfig(c)
	if err != nil {
		return err
	}
	return http2.ConfigureServer(&http.Server{TLSConfig: tc}, nil)
}

// webConfigFile is the web configuration as it is now: read again when the file changes (a new password or
// certificate path is used without a restart, as with the toolkit), which is looked at no more than once per
// recheck, not on every request and handshake as the toolkit does.
type webConfigFile struct {
	path    string
	mu      sync.Mutex
	checked time.Time // when the file was last looked at
	stamp   fileStamp
	config  *web.Config
	err     error
}

const recheck = time.Second

// fileStamp tells whether a file may have changed: a Kubernetes Secret volume replaces it by a new file (inode).
type fileStamp struct {
	mtime    time.Time
	size     int64
	dev, ino uint64
}

func (f *webConfigFile) current() (*web.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Sub(f.checked) < recheck && (f.config != nil || f.err != nil) {
		return f.config, f.err
	}
	f.checked = now
	fi, err := os.Stat(f.path)
	if err != nil {
		f.config, f.err, f.stamp = nil, err, fileStamp{}
		return nil, err
	}
	stamp := fileStamp{mtime: fi.ModTime(), size: fi.Size()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		stamp.dev, stamp.ino = uint64(st.Dev), st.Ino
	}
	if stamp != f.stamp || f.config == nil && f.err == nil {
		f.config, f.err = loadWebConfig(f.path)
		f.stamp = stamp
	}
	return f.config, f.err
}

// tlsConfig is the main listener's TLS configuration: made again from the web configuration for each connection,
// as the toolkit does, so that renewed certificates are served without a restart.
func (f *webConfigFile) tlsConfig(http2 bool) *tls.Config {
	protos := []string{"http/1.1"}
	if http2 {
		protos = []string{"h2", "http/1.1"}
	}
	return &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := f.current()
		if err != nil {
			return nil, err
		}
		tc, err := tlsConfig(c)
		if err != nil {
			return nil, err
		}
		tc.NextProtos = protos
		return tc, nil
	}}
}

// authRetryAfter is what a client refused for too many password checks is told to wait, in seconds.
const authRetryAfter = "10"

// checkContext is the context of r's password check: r's, ending at the scrape timeout the scraper sends
// (Prometheus, and its agents, send X-Prometheus-Scrape-Timeout-Seconds), after which the scraper has given up. A
// check waiting for bcrypt is refused before it, so that the scraper is answered on its connection, where asked
// again its password goes first. A value that is not a positive number of seconds, or past an hour, is ignored.
func checkContext(r *http.Request) (context.Context, context.CancelFunc) {
	s, err := strconv.ParseFloat(r.Header.Get("X-Prometheus-Scrape-Timeout-Seconds"), 64)
	if err != nil || !(s > 0 && s <= 3600) {
		return r.Context(), func() {}
	}
	return context.WithTimeout(r.Context(), time.Duration(s*float64(time.Second)))
}

// guard is the main listener's handler under a web configuration: the toolkit's rate limit, response headers and
// basic auth, in that order, with the password checks bounded by basicauth.
type guard struct {
	config  *webConfigFile
	limiter *rate.Limiter // nil: no rate limit
	checker *basicauth.Checker
	next    http.Handler
	logger  *slog.Logger
	broken  logstate.State // the configuration's error, logged when it changes
}

func newGuard(config *webConfigFile, first *web.Config, next http.Handler, logger *slog.Logger) *guard {
	g := &guard{config: config, checker: basicauth.New(basicauth.Config{}), next: next, logger: logger}
	if rl := first.RateLimiterConfig; rl.Interval != 0 {
		g.limiter = rate.NewLimiter(rate.Every(rl.Interval), rl.Burst)
		logger.Info("Rate Limiter is enabled.", "burst", rl.Burst, "interval", rl.Interval)
	}
	return g
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Context().Err() != nil {
		return // the client has gone: an HTTP/2 stream reset as it was sent, a client that hung up
	}
	c, err := g.config.current()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if _, changed := g.broken.Set(msg); changed {
		if err != nil {
			g.logger.Error("Unable to parse configuration", "file", g.config.path, "err", err)
		} else {
			g.logger.Info("web configuration readable again", "file", g.config.path)
		}
	}
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	if g.limiter != nil && !g.limiter.Allow() {
		http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
		return
	}
	for k, v := range c.HTTPConfig.Header {
		w.Header().Set(k, v)
	}
	if len(c.Users) == 0 {
		g.next.ServeHTTP(w, r)
		return
	}
	if user, password, ok := r.BasicAuth(); ok {
		ctx, cancel := checkContext(r)
		valid, err := g.checker.Check(ctx, r.RemoteAddr, user, string(c.Users[user]), password)
		cancel()
		switch {
		case errors.Is(err, basicauth.ErrBusy) || err != nil && r.Context().Err() == nil: // or its scrape's time is up
			w.Header().Set("Retry-After", authRetryAfter)
			http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
			return
		case err != nil:
			return // the client has gone
		case valid:
			g.next.ServeHTTP(w, r)
			return
		}
	}
	w.Header().Set("WWW-Authenticate", "Basic")
	http.Error(w, http.StatusText(http.StatusUnauthorized), http.StatusUnauthorized)
}
