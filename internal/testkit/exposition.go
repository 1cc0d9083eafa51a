package testkit

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// ExpositionText writes metric families in the text format, as client_golang serves them, failing the test on an
// error: the reference that the exporter's own encoding is compared with.
func ExpositionText(t testing.TB, mfs []*dto.MetricFamily) string {
	t.Helper()
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
