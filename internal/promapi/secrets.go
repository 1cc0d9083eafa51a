package promapi

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/prometheus/common/config"
)

// The HTTP client of a user's configuration adds its credentials (basic auth, authorization, OAuth2, secret
// headers) to every request it sends, the requests of a redirect included: the client cannot strip them from a
// redirected request as it does the headers of the original one. So a redirect is followed only to the same origin,
// or from http to https on the same host; any other is refused, and the query fails with a line naming it.

// errRedirect is a redirect that was not followed.
type errRedirect struct {
	from, to *url.URL
	why      string
}

func (e *errRedirect) Error() string {
	return fmt.Sprintf("redirected from %s to %s (%s): not followed, so that the credentials of the HTTP client "+
		"configuration are not sent there; give --prometheus the URL to ask", shown(e.from), shown(e.to), e.why)
}

// shown is a URL as the message says it: without a password, a query or a fragment.
func shown(u *url.URL) string {
	v := *u
	v.RawQuery, v.Fragment, v.ForceQuery = "", "", false
	return v.Redacted()
}

// checkRedirect is the client's CheckRedirect: the origin's own, after next (the configuration's, nil for Go's
// default of at most 10 redirects).
func checkRedirect(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		from := via[len(via)-1].URL
		if why := crossing(from, req.URL); why != "" {
			return &errRedirect{from: from, to: req.URL, why: why}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// crossing says why a redirect from one URL to the other would carry credentials where they must not go; "" when
// it would not.
func crossing(from, to *url.URL) string {
	switch {
	case from.Scheme == "https" && to.Scheme != "https":
		return "from https to " + to.Scheme
	case !strings.EqualFold(from.Hostname(), to.Hostname()):
		return "another host"
	case from.Scheme == "http" && to.Scheme == "https":
		return "" // the same host, upgraded: the credentials were sent in the clear already, now they are not
	case port(from) != port(to):
		return "another port"
	}
	return ""
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// ConfigWarnings says, one line each, how an HTTP client configuration read from file ("" when there is none)
// exposes its secrets to a server at base: credentials sent over http://, and the configuration or a file of
// secrets that users other than its owner can read. The caller says them once.
func ConfigWarnings(base string, cfg *config.HTTPClientConfig, file string) []string {
	var out []string
	if u, err := url.Parse(base); err == nil && u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		if what := credentials(cfg); len(what) > 0 {
			out = append(out, fmt.Sprintf("%s sends %s over http://, readable by anyone on the way: use https://",
				shown(u), strings.Join(what, " and ")))
		}
	}
	files := []string{file}
	if a := cfg.BasicAuth; a != nil {
		files = append(files, a.PasswordFile, a.UsernameFile)
	}
	if a := cfg.Authorization; a != nil {
		files = append(files, a.CredentialsFile)
	}
	if o := cfg.OAuth2; o != nil {
		files = append(files, o.ClientSecretFile, o.ClientCertificateKeyFile, o.TLSConfig.KeyFile)
	}
	files = append(files, cfg.BearerTokenFile, cfg.TLSConfig.KeyFile)
	if h := cfg.HTTPHeaders; h != nil {
		for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
			files = append(files, h.Headers[name].Files...)
		}
	}
	seen := map[string]bool{}
	for _, f := range files {
		if f == "" || seen[f] {
			continue
		}
		seen[f] = true
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o004 != 0 {
			out = append(out, fmt.Sprintf("%s holds secrets and every user of this machine can read it (mode %04o): chmod o-r %s",
				f, fi.Mode().Perm(), f))
		}
	}
	return out
}

// credentials names the credentials a configuration sends with each request.
func credentials(cfg *config.HTTPClientConfig) []string {
	var what []string
	if cfg.BasicAuth != nil {
		what = append(what, "a basic-auth password")
	}
	if cfg.Authorization != nil || cfg.BearerToken != "" || cfg.BearerTokenFile != "" {
		what = append(what, "an authorization token")
	}
	if cfg.OAuth2 != nil {
		what = append(what, "an OAuth2 token")
	}
	if h := cfg.HTTPHeaders; h != nil {
		for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
			if hd := h.Headers[name]; len(hd.Secrets) > 0 || len(hd.Files) > 0 {
				what = append(what, "the secret header "+name)
			}
		}
	}
	return what
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
