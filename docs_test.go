package fencelock_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeFileRe = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.(?:go|md))`")
)

// TestDocsReferToExistingFiles checks that the README and every page under
// docs/ refer only to files that are in the repository: each relative
// Markdown link, and each file named in code spans (`lock.go`,
// `docs/cli.md`), resolves inside the repository against the page's
// directory or the repository root; a bare file name (`renew.go`) must be
// the name of some file of the repository. NAME in a path is a
// placeholder (`docs/backends/NAME.md`).
func TestDocsReferToExistingFiles(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	more, _ := filepath.Glob("docs/*/*.md")
	pages = append(append([]string{"README.md"}, pages...), more...)
	names := map[string]bool{}
	filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		if err == nil && !d.IsDir() {
			names[d.Name()] = true
		}
		return nil
	})
	// exists reports whether p, relative to the repository root, is a
	// file or directory inside the repository.
	exists := func(p string) bool {
		p = filepath.Clean(p)
		if p == ".." || strings.HasPrefix(p, "../") || filepath.IsAbs(p) {
			return false
		}
		_, err := os.Stat(p)
		return err == nil
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Dir(page)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if !exists(filepath.Join(dir, target)) {
				t.Errorf("%s links to %s, which does not exist", page, m[1])
			}
		}
		for _, m := range codeFileRe.FindAllStringSubmatch(string(b), -1) {
			p := m[1]
			if strings.Contains(p, "NAME") || exists(filepath.Join(dir, p)) || exists(p) || (!strings.Contains(p, "/") && names[p]) {
				continue
			}
			t.Errorf("%s names the file %s, which is not in the repository", page, p)
		}
	}
}
