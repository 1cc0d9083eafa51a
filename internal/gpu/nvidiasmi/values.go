package nvidiasmi

import (
	"math"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

const mib = 1 << 20

// text returns an element's text, or "" when it is one of nvidia-smi's markers for a missing value.
func text(s string) string {
	s = strings.TrimSpace(s)
	if unavailable(s) {
		return ""
	}
	return s
}

// unavailable reports whether s is how nvidia-smi says that it has no value. Numbers are checked strictly anyway;
// this matters for text fields (UUID, name, driver version) where anything is a valid string.
func unavailable(s string) bool {
	inner := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	switch strings.ToLower(inner) {
	case "", "n/a", "na", "not supported", "not available", "insufficient permissions", "unknown", "unknown error",
		"gpu is lost", "gpu requires reset", "requested functionality has been deprecated", "none":
		return true
	}
	return false
}

func firstValid(vs ...gpu.Value) gpu.Value {
	for _, v := range vs {
		if v.Valid {
			return v
		}
	}
	return gpu.Value{}
}

// sum adds the valid parts; it is invalid only when no part is valid (a schema has some of the counters only).
func sum(vs ...gpu.Value) gpu.Value {
	var out gpu.Value
	for _, v := range vs {
		if v.Valid {
			out.V += v.V
			out.Valid = true
		}
	}
	return out
}

// unit converts a unit nvidia-smi prints into the factor to the base unit.
type unit func(string) (float64, bool)

func memoryUnits(u string) (float64, bool) {
	switch u {
	case "B":
		return 1, true
	case "KiB":
		return 1 << 10, true
	case "MiB":
		return mib, true
	case "GiB":
		return 1 << 30, true
	}
	return 0, false
}

func celsius(u string) (float64, bool) { return 1, u == "C" }

func watts(u string) (float64, bool) {
	switch u {
	case "W":
		return 1, true
	case "mW":
		return 1e-3, true
	}
	return 0, false
}

func joules(u string) (float64, bool) {
	switch u {
	case "J":
		return 1, true
	case "mJ":
		return 1e-3, true
	case "kJ":
		return 1e3, true
	}
	return 0, false
}

func hertz(u string) (float64, bool) {
	switch u {
	case "Hz":
		return 1, true
	case "kHz":
		return 1e3, true
	case "MHz":
		return 1e6, true
	case "GHz":
		return 1e9, true
	}
	return 0, false
}

func percent(u string) (float64, bool) { return 0.01, u == "%" }

func bytesValue(s string) gpu.Value { return quantity(s, memoryUnits, false) }

func utilization(s string) gpu.Value {
	v := quantity(s, percent, false)
	if v.Valid && v.V > 1 {
		return gpu.Value{}
	}
	return v
}

// quantity parses "<number> <unit>" with a unit from units. A bare number is refused: nvidia-smi always prints the
// unit, and guessing it would turn MiB into bytes.
func quantity(s string, units unit, allowNegative bool) gpu.Value {
	fields := strings.Fields(s)
	if len(fields) == 1 {
		// "30%" without the space: split the unit off the number.
		f := fields[0]
		i := strings.IndexFunc(f, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.' || r == '-') })
		if i <= 0 {
			return gpu.Value{}
		}
		fields = []string{f[:i], f[i:]}
	}
	if len(fields) != 2 {
		return gpu.Value{}
	}
	factor, ok := units(fields[1])
	if !ok {
		return gpu.Value{}
	}
	v, ok := decimal(fields[0], allowNegative)
	if !ok {
		return gpu.Value{}
	}
	// A factor below 1 divides by its inverse, a whole number: 25483012608 us is 25483.012608 s, not
	// 25483.012607999997 as the product with 1e-6 would be.
	if factor < 1 {
		v /= math.Round(1 / factor)
	} else {
		v *= factor
	}
	if math.IsInf(v, 0) {
		return gpu.Value{}
	}
	return gpu.Known(v)
}

// count parses a non-negative integer counter without unit.
func count(s string) gpu.Value {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return gpu.Value{}
	}
	return gpu.Known(float64(n))
}

// decimal accepts only plain decimal notation: strconv.ParseFloat would also take "NaN", "Inf", hex floats and
// exponents, none of which nvidia-smi prints.
func decimal(s string, allowNegative bool) (float64, bool) {
	digits, dot := 0, false
	for i, r := range s {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case r == '.' && !dot:
			dot = true
		case r == '-' && i == 0 && allowNegative:
		default:
			return 0, false
		}
	}
	if digits == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}

func pstate(s string) gpu.Value {
	s = strings.TrimSpace(s)
	if len(s) < 2 || (s[0] != 'P' && s[0] != 'p') {
		return gpu.Value{}
	}
	n, err := strconv.Atoi(s[1:])
	if err != nil || n < 0 || n > 15 || strings.HasPrefix(s[1:], "+") {
		return gpu.Value{}
	}
	return gpu.Known(float64(n))
}

// minorNumber parses <minor_number>, N/A on Windows.
func minorNumber(s string) gpu.Value {
	if n, ok := instanceID(s); ok {
		return gpu.Known(float64(n))
	}
	return gpu.Value{}
}

// instanceID parses a MIG GPU or compute instance id; N/A (not MIG) and anything else yields false.
func instanceID(s string) (int, bool) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 31)
	if err != nil {
		return 0, false
	}
	return int(n), true
}
