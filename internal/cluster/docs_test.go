package cluster

import (
	"os"
	"strings"
	"testing"
)

// docs/top.md shows the queries a reading makes, as the code writes them with the default flags.
func TestDocsShowTheQueries(t *testing.T) {
	doc, err := os.ReadFile("../../docs/top.md")
	if err != nil {
		t.Fatal(err)
	}
	for i, expr := range New(nil, Config{}).Queries(true) {
		if !strings.Contains(string(doc), "\n# "+queries[i].name+"") || !strings.Contains(string(doc), "\n"+expr+"\n") {
			t.Errorf("docs/top.md does not show the query %q:\n%s", queries[i].name, expr)
		}
	}
}
