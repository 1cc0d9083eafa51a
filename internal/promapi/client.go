// Package promapi runs instant and range queries on the Prometheus HTTP API as Prometheus, Thanos Query and Mimir serve it:
// the answer is decoded as it streams in, so that memory follows the samples kept rather than the size of the
// body, the body is bounded, the server's warnings and infos (Thanos' partial responses among them) are kept for
// the caller to show, and a failure is said in one line that names the server and, where it matters, the query.
package promapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client queries one Prometheus-compatible API.
type Client struct {
	base     *url.URL
	http     *http.Client
	maxBytes int64
}

// New returns a client of the API under base (http://prometheus:9090, or a prefix such as Mimir's
// http://mimir/prometheus), sending its requests through hc, which carries the credentials, TLS and proxy of the
// user's HTTP client configuration. A copy of hc is used, which follows redirects only within base's origin
// (secrets.go).
func New(base string, hc *http.Client) (*Client, error) {
	u, err := ParseURL(base)
	if err != nil {
		return nil, err
	}
	own := *hc
	own.CheckRedirect = checkRedirect(hc.CheckRedirect)
	return &Client{base: u, http: &own, maxBytes: DefaultReadingBytes}, nil
}

// ParseURL checks a server URL: http or https, with a host, and neither a query nor a fragment.
func ParseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%q: want an http:// or https:// URL", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%q has no host", u.Redacted())
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%q: want the server's base URL, without ?query or #fragment", u.Redacted())
	}
	return u, nil
}

// SetMaxResponseBytes changes the budget of a query whose context carries none (WithBudget).
func (c *Client) SetMaxResponseBytes(n int64) { c.maxBytes = n }

// URL is the server's URL as messages show it, without a password.
func (c *Client) URL() string { return c.base.Redacted() }

// Sample is one series of an instant vector. Metric is only valid during the call that is given it: the decoder
// reuses it for the next sample.
type Sample struct {
	Metric map[string]string
	Value  float64
	// Time is the evaluation time, in seconds since the epoch, as the server wrote it.
	Time float64
}

// Query evaluates expr at time at (the zero time: the server's now) and calls each for every sample of the
// resulting vector, in the server's order. It returns the server's warnings and infos, each prefixed with what it
// is. An error from each stops the query and is returned.
func (c *Client) Query(ctx context.Context, expr string, at time.Time, each func(Sample) error) ([]string, error) {
	form := url.Values{"query": {expr}}
	if !at.IsZero() {
		form.Set("time", apiTime(at))
	}
	return c.run(ctx, "query", form, expr, each)
}

// QueryRange evaluates expr at every step from start to end and calls each for every point of every series of the
// resulting matrix, a series' points in time order (Sample.Time is the point's), as Query does for a vector.
func (c *Client) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration, each func(Sample) error) ([]string, error) {
	form := url.Values{"query": {expr}, "start": {apiTime(start)}, "end": {apiTime(end)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	return c.run(ctx, "query_range", form, expr, each)
}

func apiTime(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64) }

// run sends a query to the API's endpoint and decodes its answer as it streams in.
func (c *Client) run(ctx context.Context, endpoint string, form url.Values, expr string, each func(Sample) error) ([]string, error) {
	if deadline, ok := ctx.Deadline(); ok {
		// The server gives up when the client does, instead of evaluating for no one.
		if left := time.Until(deadline); left > 0 {
			form.Set("timeout", strconv.FormatInt(max(left.Milliseconds(), 1), 10)+"ms") // PromQL's durations are whole
		}
	}
	resp, err := c.post(ctx, endpoint, form)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	budget := budgetOf(ctx)
	if budget == nil {
		budget = NewBudget(c.maxBytes)
	}
	body := &boundedReader{r: resp.Body, budget: budget}
	if resp.StatusCode/100 != 2 && !isAPIError(resp) {
		return nil, c.statusError(resp, body, expr)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "json") {
		return nil, classified{fmt.Errorf("Prometheus at %s: the answer is %q, not the API's JSON (want the server's base URL)",
			c.URL(), ct), ErrNotAPI}
	}
	warnings, err := decode(body, each)
	var apiErr *APIError
	switch {
	case errors.As(err, &apiErr):
		apiErr.URL, apiErr.Query, apiErr.Status = c.URL(), expr, resp.StatusCode
		return warnings, apiErr
	case errors.Is(err, errTooLarge):
		return warnings, classified{fmt.Errorf("Prometheus at %s: the answers to a reading are larger than %s in all "+
			"(at the answer to %s): narrow it with a selector", c.URL(), sizeText(budget.size), expr), ErrTooLarge}
	case errors.Is(err, errValueTooLarge):
		return warnings, fmt.Errorf("Prometheus at %s: reading the answer to %s: %w", c.URL(), expr, err)
	case err != nil && ctx.Err() != nil:
		return warnings, c.contextError(ctx, err)
	case err != nil:
		return warnings, fmt.Errorf("Prometheus at %s: reading the answer to %s: %w", c.URL(), expr, err)
	}
	return warnings, nil
}

// post sends the query as a form, as Prometheus' own clients do (a selector can be longer than a URL may be), and
// falls back to GET where a proxy allows only that.
func (c *Client) post(ctx context.Context, path string, form url.Values) (*http.Response, error) {
	endpoint := c.base.JoinPath("api", "v1", path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint.String(), strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, err)
	}
	if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotImplemented {
		return resp, nil
	}
	resp.Body.Close()
	endpoint.RawQuery = form.Encode()
	req, err = http.NewRequestWithContext(ctx, http.MethodGet, endpoint.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if resp, err = c.http.Do(req); err != nil {
		return nil, c.transportError(ctx, err)
	}
	return resp, nil
}

// ErrUnreachable, ErrUnauthorized, ErrNotAPI and ErrTooLarge classify failures (errors.Is), for callers that add
// advice.
var (
	ErrUnreachable  = errors.New("unreachable")
	ErrUnauthorized = errors.New("unauthorized")
	ErrNotAPI       = errors.New("not a Prometheus API")
	ErrTooLarge     = errors.New("answers larger than the reading's budget")
)

// classified is an error with its class, which its message does not repeat.
type classified struct {
	error
	class error
}

func (c classified) Unwrap() []error { return []error{c.error, c.class} }

// transportError says why no answer came.
func (c *Client) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return c.contextError(ctx, err)
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err // the URL is said once, redacted, below
	}
	if redirect := (*errRedirect)(nil); errors.As(err, &redirect) {
		return fmt.Errorf("Prometheus at %s: %w", c.URL(), redirect)
	}
	return classified{fmt.Errorf("cannot reach Prometheus at %s: %w", c.URL(), err), ErrUnreachable}
}

func (c *Client) contextError(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("Prometheus at %s did not answer in time: %w", c.URL(), context.DeadlineExceeded)
	}
	return fmt.Errorf("Prometheus at %s: %w", c.URL(), ctx.Err())
}

// isAPIError reports whether a failed answer is the API's own JSON error, which decode reads.
func isAPIError(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusServiceUnavailable, http.StatusInternalServerError:
		return strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")
	}
	return false
}

// statusError says what an answer that is not the API's was: a refusal by the server or a proxy in front of it,
// or a URL that is not the API.
func (c *Client) statusError(resp *http.Response, body io.Reader, expr string) error {
	b, _ := io.ReadAll(io.LimitReader(body, 512))
	detail := firstLine(b)
	if detail != "" {
		detail = ": " + detail
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		return classified{fmt.Errorf("Prometheus at %s refused the request: %s%s", c.URL(), resp.Status, detail), ErrUnauthorized}
	case http.StatusNotFound:
		return classified{fmt.Errorf("Prometheus at %s: %s for %s: no Prometheus API there (want the server's base URL; Mimir's ends in /prometheus)",
			c.URL(), resp.Status, resp.Request.URL.Path), ErrNotAPI}
	}
	return fmt.Errorf("Prometheus at %s answered %s%s (query: %s)", c.URL(), resp.Status, detail, expr)
}

// firstLine is the first line of a body, made printable and short, for an error message.
func firstLine(b []byte) string {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	s := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return -1
		}
		return r
	}, strings.ToValidUTF8(string(b), "?"))
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// APIError is the API's own answer that a query failed: bad PromQL, a timeout, too many samples.
type APIError struct {
	URL, Query string
	Status     int
	Type, Msg  string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("Prometheus at %s: %s: %s (query: %s)", e.URL, e.Type, e.Msg, e.Query)
}

// decode reads an API answer, {"status":…, "data":{"resultType":"vector","result":[…]}, "warnings":[…], …}, in
// any order of its keys (but resultType before result, as servers write it), one sample at a time.
func decode(r io.Reader, each func(Sample) error) (warnings []string, err error) {
	dec := json.NewDecoder(r)
	var status, errType, errMsg string
	resultType := ""
	sawResult := false
	var early json.RawMessage
	err = object(dec, func(key string) error {
		switch key {
		case "status":
			return dec.Decode(&status)
		case "errorType":
			return dec.Decode(&errType)
		case "error":
			return dec.Decode(&errMsg)
		case "warnings", "infos":
			return messages(dec, strings.TrimSuffix(key, "s"), &warnings)
		case "data":
			return object(dec, func(key string) error {
				switch key {
				case "resultType":
					if err := dec.Decode(&resultType); err != nil {
						return err
					}
					if resultType != "vector" && resultType != "matrix" {
						return fmt.Errorf("the result is a %s, not an instant vector or a range", resultType)
					}
					return nil
				case "result":
					sawResult = true
					if resultType == "" {
						// Servers write the type first; a result before it is kept until the type says how to read it.
						return dec.Decode(&early)
					}
					return result(dec, resultType, each)
				}
				return skip(dec)
			})
		}
		return skip(dec)
	})
	if err == nil && early != nil {
		if resultType == "" {
			return warnings, classified{errors.New("a result without its type"), ErrNotAPI}
		}
		err = result(json.NewDecoder(bytes.NewReader(early)), resultType, each)
	}
	switch {
	case err != nil:
		return warnings, err
	case status == "error":
		return warnings, &APIError{Type: errType, Msg: errMsg}
	case status != "success":
		return warnings, classified{fmt.Errorf("status %q is neither success nor error", status), ErrNotAPI}
	case !sawResult:
		return warnings, classified{errors.New("no result in the answer"), ErrNotAPI}
	}
	return warnings, nil
}

// result reads a result of its type, a sample or a point at a time.
func result(dec *json.Decoder, resultType string, each func(Sample) error) error {
	if resultType == "matrix" {
		return matrix(dec, each)
	}
	return vector(dec, each)
}

// object reads a JSON object, calling field for each key with the decoder at its value; field must read the value.
func object(dec *json.Decoder, field func(key string) error) error {
	if err := delim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := t.(string)
		if !ok {
			return fmt.Errorf("an object key is %v", t)
		}
		if err := field(key); err != nil {
			return err
		}
	}
	return delim(dec, '}')
}

func delim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return classified{fmt.Errorf("want %v, got %v", want, t), ErrNotAPI}
	}
	return nil
}

// skip reads past a value, which the decoder holds whole while it does: boundedReader bounds it.
func skip(dec *json.Decoder) error { return dec.Decode(&discard{}) }

// discard is a value that the decoder reads and forgets, without a copy of it.
type discard struct{}

func (*discard) UnmarshalJSON([]byte) error { return nil }

// messages reads an array of warnings or infos, a string at a time, keeping maxWarnings of them (each prefixed with
// kind, "warning" or "info") and one more line that counts the rest.
func messages(dec *json.Decoder, kind string, out *[]string) error {
	if t, err := dec.Token(); err != nil {
		return err
	} else if t == nil {
		return nil // null: none
	} else if t != json.Delim('[') {
		return classified{fmt.Errorf("%ss are %v, not an array", kind, t), ErrNotAPI}
	}
	kept, more := 0, 0
	for dec.More() {
		var m string
		if err := dec.Decode(&m); err != nil {
			return err
		}
		if kept < maxWarnings {
			*out = append(*out, kind+": "+m)
			kept++
		} else {
			more++
		}
	}
	if more > 0 {
		*out = append(*out, fmt.Sprintf("%s: %d more %ss in this answer", kind, more, kind))
	}
	return delim(dec, ']')
}

// vector reads the result array one sample at a time into one reused map.
func vector(dec *json.Decoder, each func(Sample) error) error {
	if err := delim(dec, '['); err != nil {
		return err
	}
	s := sample{metric: make(map[string]string, 24), names: make(map[string]string)}
	for dec.More() {
		if err := dec.Decode(&s); err != nil {
			return err
		}
		if !s.set {
			return fmt.Errorf("a sample without a value")
		}
		if err := each(Sample{Metric: s.metric, Value: s.v, Time: s.t}); err != nil {
			return err
		}
	}
	return delim(dec, ']')
}

// point is a sample's [time, "value"]: the time a number of seconds, the value a string, as the API writes them
// ("NaN" and "+Inf" included).
type point struct {
	t, v float64
	set  bool
}

func (p *point) UnmarshalJSON(b []byte) error {
	var pair [2]json.RawMessage
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("a sample's value %s: %w", b, err)
	}
	t, err := strconv.ParseFloat(string(pair[0]), 64)
	if err != nil {
		return fmt.Errorf("a sample's time %s: %w", pair[0], err)
	}
	var s string
	if err := json.Unmarshal(pair[1], &s); err != nil {
		return fmt.Errorf("a sample's value %s: %w", pair[1], err)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("a sample's value %q: %w", s, err)
	}
	*p = point{t: t, v: v, set: true}
	return nil
}
