package promapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// server answers the API's query endpoint with body and status, and records the requests.
type server struct {
	*httptest.Server
	requests []*http.Request
	forms    []string
}

func newServer(t *testing.T, status int, contentType, body string) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		s.requests = append(s.requests, r)
		s.forms = append(s.forms, r.Form.Encode())
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(s.Close)
	return s
}

func query(t *testing.T, base string, at time.Time) ([]Sample, []string, error) {
	t.Helper()
	c, err := New(base, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	var got []Sample
	ws, err := c.Query(context.Background(), `up{job="x"}`, at, func(s Sample) error {
		m := make(map[string]string)
		for k, v := range s.Metric {
			m[k] = v
		}
		got = append(got, Sample{Metric: m, Value: s.Value, Time: s.Time})
		return nil
	})
	return got, ws, err
}

const jsonType = "application/json"

func TestQueryStreamsSamplesAndKeepsWarnings(t *testing.T) {
	// Keys in an order Prometheus does not use, an extra key, and the warnings of a Thanos partial response.
	body := `{"warnings":["partial response: store 10.0.0.7:10901 unavailable"],"status":"success",
	"data":{"extra":{"x":[1]},"resultType":"vector","result":[
	  {"metric":{"__name__":"up","instance":"gpu-a","job":"x"},"value":[1700000000.5,"1"]},
	  {"metric":{"instance":"gpu-b"},"value":[1700000000.5,"NaN"]},
	  {"metric":{},"value":[1700000000.5,"+Inf"]}]},
	"infos":["PromQL info: metric might not be a counter"]}`
	srv := newServer(t, 200, jsonType, body)
	got, ws, err := query(t, srv.URL+"/prefix/", time.UnixMilli(1700000000123))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Metric["instance"] != "gpu-a" || got[0].Metric["__name__"] != "up" || got[0].Value != 1 ||
		got[0].Time != 1700000000.5 || len(got[1].Metric) != 1 || !math.IsNaN(got[1].Value) || !math.IsInf(got[2].Value, 1) {
		t.Errorf("samples: %+v", got)
	}
	want := []string{"warning: partial response: store 10.0.0.7:10901 unavailable", "info: PromQL info: metric might not be a counter"}
	if fmt.Sprint(ws) != fmt.Sprint(want) {
		t.Errorf("warnings %q, want %q", ws, want)
	}
	r := srv.requests[0]
	if r.Method != http.MethodPost || r.URL.Path != "/prefix/api/v1/query" {
		t.Errorf("request %s %s", r.Method, r.URL.Path)
	}
	if f := srv.forms[0]; !strings.Contains(f, "query=up%7Bjob%3D%22x%22%7D") || !strings.Contains(f, "time=1700000000.123") {
		t.Errorf("form %s", f)
	}
}

func TestQuerySendsTheDeadline(t *testing.T) {
	srv := newServer(t, 200, jsonType, `{"status":"success","data":{"resultType":"vector","result":[]}}`)
	c, _ := New(srv.URL, http.DefaultClient)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Query(ctx, "up", time.Time{}, func(Sample) error { return nil }); err != nil {
		t.Fatal(err)
	}
	f := srv.forms[0]
	if !strings.Contains(f, "timeout=19") || !strings.Contains(f, "ms") || strings.Contains(f, "time=") && !strings.Contains(f, "timeout=") {
		t.Errorf("form %s: want a timeout in whole milliseconds and no time", f)
	}
}

// A proxy that allows only GET gets the query again as a GET.
func TestQueryFallsBackToGet(t *testing.T) {
	var methods []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		methods = append(methods, r.Method)
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Query().Get("query") != `up{job="x"}` {
			t.Errorf("GET query %q", r.URL.RawQuery)
		}
		w.Header().Set("Content-Type", jsonType)
		io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2"]}]}}`)
	}))
	defer srv.Close()
	got, _, err := query(t, srv.URL, time.Time{})
	if err != nil || len(got) != 1 || fmt.Sprint(methods) != "[POST GET]" {
		t.Errorf("samples %v, error %v, methods %v", got, err, methods)
	}
}

func TestQueryErrorsSayWhatWentWrong(t *testing.T) {
	for _, c := range []struct {
		name        string
		status      int
		contentType string
		body        string
		want        []string
		class       error
	}{
		{"bad query", 400, jsonType, `{"status":"error","errorType":"bad_data","error":"parse error at char 3"}`,
			[]string{"bad_data: parse error at char 3", `(query: up{job="x"})`}, nil},
		{"timeout", 503, jsonType, `{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}`,
			[]string{"timeout: query timed out"}, nil},
		{"unauthorized", 401, "text/plain", "Unauthorized\n", []string{"refused the request: 401 Unauthorized: Unauthorized"}, ErrUnauthorized},
		{"forbidden", 403, "text/html", "<html>no</html>", []string{"403 Forbidden: <html>no</html>"}, ErrUnauthorized},
		{"not the API", 404, "text/plain", "404 page not found", []string{"404 Not Found for /api/v1/query", "Mimir's ends in /prometheus"}, ErrNotAPI},
		{"a web page", 200, "text/html", "<html>Grafana</html>", []string{`the answer is "text/html"`}, ErrNotAPI},
		{"bad gateway", 502, "text/plain", "upstream\x00 down\nmore", []string{"answered 502 Bad Gateway: upstream down", "(query: "}, nil},
		{"not JSON", 200, jsonType, `<html>`, []string{"reading the answer to up{job=\"x\"}: invalid character"}, nil},
		{"a scalar", 200, jsonType, `{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}`, []string{"is a scalar, not an instant vector or a range"}, nil},
		{"no result", 200, jsonType, `{"status":"success"}`, []string{"no result in the answer"}, ErrNotAPI},
		{"odd status", 200, jsonType, `{"status":"fine","data":{"resultType":"vector","result":[]}}`, []string{`status "fine"`}, ErrNotAPI},
		{"no value", 200, jsonType, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}`, []string{"a sample without a value"}, nil},
		{"bad value", 200, jsonType, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}`, []string{`a sample's value "x"`}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newServer(t, c.status, c.contentType, c.body)
			_, _, err := query(t, srv.URL, time.Time{})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), "Prometheus at "+srv.URL) {
				t.Errorf("error %q does not name the server", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
			if c.class != nil && !errors.Is(err, c.class) {
				t.Errorf("error %q is not %v", err, c.class)
			}
		})
	}
}

func TestQueryUnreachable(t *testing.T) {
	srv := newServer(t, 200, jsonType, "")
	srv.Close()
	_, _, err := query(t, "http://user:secret@"+strings.TrimPrefix(srv.URL, "http://"), time.Time{})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "cannot reach Prometheus at http://user:xxxxx@") ||
		strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("error %v", err)
	}
}

func TestQueryDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	c, _ := New(srv.URL, http.DefaultClient)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Query(ctx, "up", time.Time{}, func(Sample) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not answer in time") {
		t.Errorf("error %v", err)
	}
}

func TestQueryBoundsTheAnswer(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[` +
		strings.Repeat(`{"metric":{"a":"b"},"value":[1,"1"]},`, 1000) + `{"metric":{},"value":[1,"1"]}]}}`
	srv := newServer(t, 200, jsonType, body)
	c, _ := New(srv.URL, http.DefaultClient)
	c.SetMaxResponseBytes(4 << 10)
	n := 0
	_, err := c.Query(context.Background(), "up", time.Time{}, func(Sample) error { n++; return nil })
	if err == nil || !strings.Contains(err.Error(), "are larger than 4 KiB in all (at the answer to up): narrow it with a selector") {
		t.Errorf("error %v after %d samples", err, n)
	}
	if n == 0 || n > 120 {
		t.Errorf("%d samples read before the bound, want some but not all", n)
	}
}

func TestQueryStopsOnTheCallersError(t *testing.T) {
	srv := newServer(t, 200, jsonType, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1"]},{"metric":{},"value":[1,"2"]}]}}`)
	c, _ := New(srv.URL, http.DefaultClient)
	stop := errors.New("enough")
	n := 0
	_, err := c.Query(context.Background(), "up", time.Time{}, func(Sample) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("error %v after %d samples", err, n)
	}
}

func TestParseURL(t *testing.T) {
	for _, ok := range []string{"http://prometheus:9090", "https://thanos.example.com/", "http://mimir/prometheus"} {
		if _, err := ParseURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for in, why := range map[string]string{
		"prometheus:9090":           "want an http:// or https:// URL",
		"http://":                   "has no host",
		"http://p:9090/?x=1":        "without ?query",
		"ftp://p":                   "want an http",
		"http://u:pw@p:9090/a b%zz": "is not a URL",
	} {
		_, err := ParseURL(in)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: error %v, want %q", in, err, why)
		}
	}
}

// The decoder never panics and never calls back with a sample it could not read, whatever the body.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"b"},"value":[1.5,"2"]}]},"warnings":["w"]}`,
		`{"status":"error","errorType":"bad_data","error":"x"}`,
		`{"data":{"result":[{"value":[1,"NaN"],"metric":{}}],"resultType":"vector"},"status":"success"}`,
		`[]`, `{"status":1}`, `{"data":{"result":{}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := decode(strings.NewReader(string(b)), func(s Sample) error {
			if s.Metric == nil {
				t.Fatal("a sample without its metric")
			}
			return nil
		})
		_ = err
	})
}

// The fast path reads a sample as encoding/json does, or leaves it to encoding/json: the same labels, time and
// value, or an error from both.
func FuzzSampleIsEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"metric":{"__name__":"up","instance":"gpu-a:9402","job":"x"},"value":[1700000000.123,"1"]}`,
		`{ "value" : [ 1.5e9 , "NaN" ] , "metric" : { } }`,
		`{"metric":{"a":"b\"c","d":"\u00e9"},"value":[1,"+Inf"]}`,
		`{"metric":{"a":"\xff"},"value":[1,"2"]}`,
		`{"metric":{"a":"b"},"value":[1,"x"]}`,
		`{"metric":{"a":"b"},"histogram":[1,{}]}`,
		`{"metric":null,"value":null}`,
		`{"metric":{"a":"b","a":"c"},"value":[1,"2"],"value":[3,"4"]}`,
		`{"metric":{"a":1},"value":[1,"2"]}`,
		`{"metric":{},"value":["1","2"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return // the decoder hands over only what it found to be one valid value
		}
		fast := sample{metric: map[string]string{"stale": "label"}, names: map[string]string{}}
		fastErr := fast.UnmarshalJSON(b)
		var slow struct {
			Metric map[string]string `json:"metric"`
			Value  *point            `json:"value"`
		}
		slowErr := json.Unmarshal(b, &slow)
		if (fastErr == nil) != (slowErr == nil) {
			t.Fatalf("%s: fast path error %v, encoding/json's %v", b, fastErr, slowErr)
		}
		if fastErr != nil {
			return
		}
		if len(fast.metric) != len(slow.Metric) {
			t.Fatalf("%s: labels %v, encoding/json's %v", b, fast.metric, slow.Metric)
		}
		for k, v := range slow.Metric {
			if fast.metric[k] != v {
				t.Fatalf("%s: labels %v, encoding/json's %v", b, fast.metric, slow.Metric)
			}
		}
		if fast.set != (slow.Value != nil) || fast.set && (fast.t != slow.Value.t || !sameFloat(fast.v, slow.Value.v)) {
			t.Fatalf("%s: value %v %v %v, encoding/json's %+v", b, fast.set, fast.t, fast.v, slow.Value)
		}
	})
}

func sameFloat(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

func TestQueryRangeCallsEachPoint(t *testing.T) {
	// The result before its type, as a JSON encoder that sorts keys writes it.
	body := `{"status":"success","data":{"result":[
	  {"metric":{"instance":"gpu-a","uuid":"GPU-1"},"values":[[1700000000,"0.5"],[1700000010,"NaN"]]},
	  {"values":[[1700000000,"1"]],"metric":{"instance":"gpu-\u0062"}}],"resultType":"matrix"}}`
	srv := newServer(t, 200, jsonType, body)
	c, err := New(srv.URL, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	start := time.Unix(1700000000, 0)
	_, err = c.QueryRange(context.Background(), "gpu_utilization_ratio", start, start.Add(10*time.Second), 10*time.Second,
		func(s Sample) error {
			got = append(got, fmt.Sprintf("%s %v %v", s.Metric["instance"], s.Time, s.Value))
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[gpu-a 1.7e+09 0.5 gpu-a 1.70000001e+09 NaN gpu-b 1.7e+09 1]"; fmt.Sprint(got) != want {
		t.Errorf("points %v, want %s", got, want)
	}
	if r := srv.requests[0]; r.URL.Path != "/api/v1/query_range" || !strings.Contains(srv.forms[0], "step=10") ||
		!strings.Contains(srv.forms[0], "start=1700000000.000") || !strings.Contains(srv.forms[0], "end=1700000010.000") {
		t.Errorf("request %s %s", r.URL.Path, srv.forms[0])
	}
}

// The fast path reads a range's series as encoding/json does, or leaves it to encoding/json.
func FuzzSeriesIsEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"metric":{"__name__":"up","instance":"gpu-a:9402"},"values":[[1700000000.123,"1"],[1700000010,"NaN"]]}`,
		`{ "values" : [ ] , "metric" : { } }`,
		`{"metric":{"a":"b\"c"},"values":[[1,"+Inf"]]}`,
		`{"metric":{"a":"b"},"values":[[1,"2"]],"values":[[3,"4"]]}`,
		`{"metric":{"a":"b"},"values":[[1,"x"]]}`,
		`{"metric":{"a":"b"},"values":[1,"2"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		fast := series{sample: sample{metric: map[string]string{"stale": "label"}, names: map[string]string{}}}
		fastErr := fast.UnmarshalJSON(b)
		var slow struct {
			Metric map[string]string `json:"metric"`
			Values []point           `json:"values"`
		}
		slowErr := json.Unmarshal(b, &slow)
		if (fastErr == nil) != (slowErr == nil) {
			t.Fatalf("%s: fast path error %v, encoding/json's %v", b, fastErr, slowErr)
		}
		if fastErr != nil {
			return
		}
		if fmt.Sprint(fast.metric) != fmt.Sprint(slow.Metric) && !(len(fast.metric) == 0 && len(slow.Metric) == 0) {
			t.Fatalf("%s: labels %v, encoding/json's %v", b, fast.metric, slow.Metric)
		}
		if len(fast.points) != len(slow.Values) {
			t.Fatalf("%s: %d points, encoding/json's %d", b, len(fast.points), len(slow.Values))
		}
		for i, p := range slow.Values {
			if fast.points[i].t != p.t || !sameFloat(fast.points[i].v, p.v) {
				t.Fatalf("%s: point %d %+v, encoding/json's %+v", b, i, fast.points[i], p)
			}
		}
	})
}
