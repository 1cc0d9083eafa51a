package promapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// sample is one element of a vector result: {"metric":{…},"value":[time,"value"]}. Its decoding reads the element
// the json.Decoder has already found, in place: the API writes samples as plain objects of plain strings, and reading
// those without reflection or a copy halves a thousand nodes' decoding. Anything else (an escape in a string, bytes
// that are not UTF-8, a key the fast path does not know) is decoded by encoding/json instead, so that the result is
// always encoding/json's (FuzzSampleIsEncodingJSON holds the two to it).
type sample struct {
	metric map[string]string // reused: cleared before each sample
	names  map[string]string // label names seen, so that each is allocated once
	t, v   float64
	set    bool
}

func (s *sample) UnmarshalJSON(b []byte) error {
	clear(s.metric)
	s.set = false
	if err := s.fast(b); err == nil {
		return nil
	} else if !errors.Is(err, errSlowPath) {
		return err
	}
	clear(s.metric)
	var slow struct {
		Metric map[string]string `json:"metric"`
		Value  *point            `json:"value"`
	}
	slow.Metric = s.metric
	if err := json.Unmarshal(b, &slow); err != nil {
		return err
	}
	if slow.Value != nil {
		s.t, s.v, s.set = slow.Value.t, slow.Value.v, true
	}
	return nil
}

// errSlowPath says that the fast path does not read this sample; encoding/json does.
var errSlowPath = errors.New("not a plain sample")

// fast reads a sample whose strings have no escapes, whose keys are metric and value, and whose bytes are UTF-8.
func (s *sample) fast(b []byte) error {
	r := reader{b: b}
	return r.object(func(key []byte) error {
		switch string(key) {
		case "metric":
			return s.labels(&r)
		case "value":
			return s.point(&r)
		}
		return errSlowPath
	})
}

// object reads the whole text as one object of the fast path, calling field for each key with the reader at its
// value; field reads the value.
func (r *reader) object(field func(key []byte) error) error {
	if !r.delim('{') {
		return errSlowPath
	}
	for first := true; ; first = false {
		if r.delim('}') {
			return r.end()
		}
		if !first && !r.delim(',') {
			return errSlowPath
		}
		key, ok := r.str()
		if !ok || !r.delim(':') {
			return errSlowPath
		}
		if err := field(key); err != nil {
			return err
		}
	}
}

func (s *sample) labels(r *reader) error {
	if !r.delim('{') {
		return errSlowPath
	}
	for first := true; ; first = false {
		if r.delim('}') {
			return nil
		}
		if !first && !r.delim(',') {
			return errSlowPath
		}
		name, ok := r.str()
		if !ok || !r.delim(':') {
			return errSlowPath
		}
		value, ok := r.str()
		if !ok {
			return errSlowPath
		}
		n, ok := s.names[string(name)]
		if !ok {
			n = string(name)
			s.names[n] = n
		}
		s.metric[n] = string(value)
	}
}

// point reads [time, "value"]; a value that is not a number is an error, as encoding/json's path makes it.
func (s *sample) point(r *reader) error {
	if !r.delim('[') {
		return errSlowPath
	}
	r.space()
	start := r.i
	for r.i < len(r.b) && bytes.IndexByte([]byte("0123456789.eE+-"), r.b[r.i]) >= 0 {
		r.i++
	}
	num := r.b[start:r.i]
	if !json.Valid(num) || !r.delim(',') {
		return errSlowPath
	}
	value, ok := r.str()
	if !ok || !r.delim(']') {
		return errSlowPath
	}
	t, err := strconv.ParseFloat(string(num), 64)
	if err != nil {
		return errSlowPath
	}
	v, err := strconv.ParseFloat(string(value), 64)
	if err != nil {
		return fmt.Errorf("a sample's value %q: %w", value, err)
	}
	s.t, s.v, s.set = t, v, true
	return nil
}

// reader walks JSON text that the decoder has found to be one valid value.
type reader struct {
	b []byte
	i int
}

func (r *reader) space() {
	for r.i < len(r.b) && (r.b[r.i] == ' ' || r.b[r.i] == '\t' || r.b[r.i] == '\n' || r.b[r.i] == '\r') {
		r.i++
	}
}

// delim takes c after optional white space.
func (r *reader) delim(c byte) bool {
	r.space()
	if r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// str takes a string without escapes or control characters, of UTF-8, and returns its bytes.
func (r *reader) str() ([]byte, bool) {
	if !r.delim('"') {
		return nil, false
	}
	start := r.i
	for r.i < len(r.b) {
		switch c := r.b[r.i]; {
		case c == '"':
			s := r.b[start:r.i]
			r.i++
			return s, utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		}
		r.i++
	}
	return nil, false
}

func (r *reader) end() error {
	r.space()
	if r.i != len(r.b) {
		return errSlowPath
	}
	return nil
}

// series is one element of a matrix result: {"metric":{…},"values":[[time,"value"],…]}, read in place as sample
// reads a vector's, and by encoding/json where the fast path does not read it.
type series struct {
	sample
	points []point // reused: emptied before each series
}

func (s *series) UnmarshalJSON(b []byte) error {
	clear(s.metric)
	s.points = s.points[:0]
	if err := s.fast(b); err == nil {
		return nil
	} else if !errors.Is(err, errSlowPath) {
		return err
	}
	clear(s.metric)
	s.points = s.points[:0]
	slow := struct {
		Metric map[string]string `json:"metric"`
		Values *[]point          `json:"values"`
	}{Metric: s.metric, Values: &s.points}
	return json.Unmarshal(b, &slow)
}

// fast reads a series whose strings have no escapes, whose keys are metric and values, and whose bytes are UTF-8.
func (s *series) fast(b []byte) error {
	r := reader{b: b}
	return r.object(func(key []byte) error {
		switch string(key) {
		case "metric":
			return s.labels(&r)
		case "values":
			s.points = s.points[:0] // a repeated key replaces, as encoding/json's does
			if !r.delim('[') {
				return errSlowPath
			}
			for i := 0; !r.delim(']'); i++ {
				if i > 0 && !r.delim(',') {
					return errSlowPath
				}
				if err := s.point(&r); err != nil {
					return err
				}
				s.points = append(s.points, point{t: s.t, v: s.v, set: true})
			}
			return nil
		}
		return errSlowPath
	})
}

// matrix reads a range result one series at a time, and calls each for every point of it.
func matrix(dec *json.Decoder, each func(Sample) error) error {
	if err := delim(dec, '['); err != nil {
		return err
	}
	s := series{sample: sample{metric: make(map[string]string, 24), names: make(map[string]string)}}
	for dec.More() {
		if err := dec.Decode(&s); err != nil {
			return err
		}
		for _, p := range s.points {
			if err := each(Sample{Metric: s.metric, Value: p.v, Time: p.t}); err != nil {
				return err
			}
		}
	}
	return delim(dec, ']')
}
