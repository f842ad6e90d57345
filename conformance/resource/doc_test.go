package resource_test

import (
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/internal/fencingdoc"
)

// TestCasesAreTheDocumentedTable: resource.Cases is docs/fencing.md's
// fencing:cases table, row for row, so the suite a kit passes is the rule
// the page states.
func TestCasesAreTheDocumentedTable(t *testing.T) {
	doc, err := fencingdoc.Load(fencingdoc.RepoFile("docs/fencing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) != len(resource.Cases) {
		t.Errorf("docs/fencing.md has %d cases; resource.Cases has %d", len(doc.Cases), len(resource.Cases))
	}
	for i := range min(len(doc.Cases), len(resource.Cases)) {
		d, c := doc.Cases[i], resource.Cases[i]
		want := resource.Case{Token: fencelock.Token(d.Token), Holder: d.Holder, Accept: d.Accept, Why: d.Why}
		if d.Step != i+1 {
			t.Errorf("docs/fencing.md row %d is numbered step %d", i+1, d.Step)
		}
		if c != want {
			t.Errorf("step %d: resource.Cases has %+v; docs/fencing.md has %+v", i+1, c, want)
		}
	}
}
