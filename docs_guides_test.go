package fencelock_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// generatedResults are the pages under docs/ that record measurements and
// runs (written by `fencelock safety` and the benchmarks): they carry dates,
// times and revisions on purpose. Every other page is a guide.
var generatedResults = []string{
	"docs/performance.md",
	"docs/safety.md",
	"docs/safety-peers.md",
	"docs/safety-soak/",
}

// guidePages returns README.md and every Markdown page under docs/ except
// the generated results.
func guidePages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir("docs", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		p := filepath.ToSlash(path)
		for _, g := range generatedResults {
			if p == g || p+"/" == g || strings.HasPrefix(p, g) && strings.HasSuffix(g, "/") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			pages = append(pages, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

// A guideRule is one kind of lab-notebook entry a guide must not carry.
type guideRule struct {
	what string
	re   *regexp.Regexp
	// inCode reports whether the rule applies inside fenced code blocks
	// too. A commit hash is looked for in prose and inline code only:
	// example output in code blocks shows hex owner ids and lease ids
	// (`web1:4242/9f3a1c2b7d10.1`) that a hash pattern cannot tell from a
	// revision. Dates, times, tracker numbers and machine paths are wrong
	// in a code block as anywhere else.
	inCode bool
	// keep, if set, reports whether a match is not an entry after all.
	keep func(string) bool
}

var guideRules = []guideRule{
	{what: "a date", re: regexp.MustCompile(`\b20\d\d-[01]\d-[0-3]\d\b`), inCode: true},
	{what: "a time of day in UTC", re: regexp.MustCompile(`\b\d{1,2}:\d\d(?::\d\d)?\s*UTC\b`), inCode: true},
	{what: "a commit hash", re: regexp.MustCompile(`\b[0-9a-f]{7,40}\b`), keep: func(w string) bool {
		return !strings.ContainsAny(w, "0123456789") || !strings.ContainsAny(w, "abcdef")
	}},
	{what: "a tracker reference", re: regexp.MustCompile(`(?i)\b(?:issue|task|ticket|bug)s?\s+#?\d+\b`), inCode: true},
	{what: "a tracker reference", re: regexp.MustCompile(`(?:^|[^&\w])#\d+\b`), inCode: true},
	{what: "a path on a developer's machine", re: regexp.MustCompile(`/work/|/home/|/root/|testenv\.env`), inCode: true},
}

// TestGuidesAreNotLabNotebooks checks that the README and every guide
// under docs/ say what is true now and how to use it, with no diary: no
// dated run (2026-11-24, 23:31 UTC), no commit hash, no number of an issue
// or task in a tracker the reader cannot see (issue 17, task 9, #12), and
// no path of a developer's machine (/work/…, /home/…, /root/…,
// testenv.env). History is in git; measurements are in the generated
// results (docs/performance.md, docs/safety.md), which this test skips.
//
// A line is checked on its own, except that a match may run over one line
// break (a date or "issue 17" wrapped across lines); fenced code blocks are
// exempt from the commit-hash rule only (see guideRule.inCode).
func TestGuidesAreNotLabNotebooks(t *testing.T) {
	for _, page := range guidePages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		inFence := false
		for i, line := range lines {
			if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
				inFence = !inFence
				continue
			}
			// text is this line joined to the next, so that a match
			// wrapped over the break is seen; a match that starts on the
			// next line is left to that line.
			text := line
			if i+1 < len(lines) {
				text += " " + lines[i+1]
			}
			for _, r := range guideRules {
				if inFence && !r.inCode {
					continue
				}
				for _, loc := range r.re.FindAllStringIndex(text, -1) {
					if loc[0] >= len(line) {
						continue
					}
					m := strings.TrimSpace(text[loc[0]:loc[1]])
					if r.keep != nil && r.keep(m) {
						continue
					}
					t.Errorf("%s:%d has %s (%q): a guide says what is true now; history is in git, measurements in docs/performance.md or docs/safety.md", page, i+1, r.what, m)
				}
			}
		}
	}
}

// TestGuideRulesFindLabNotebookEntries checks the rules of
// TestGuidesAreNotLabNotebooks on sample lines, so a rule that stops
// matching (or starts matching ordinary prose) fails here rather than
// letting a diary back into the guides unnoticed.
func TestGuideRulesFindLabNotebookEntries(t *testing.T) {
	found := func(s string, code bool) bool {
		for _, r := range guideRules {
			if code && !r.inCode {
				continue
			}
			for _, m := range r.re.FindAllString(s, -1) {
				if r.keep == nil || !r.keep(strings.TrimSpace(m)) {
					return true
				}
			}
		}
		return false
	}
	for _, s := range []string{
		"Re-measured on 2026-11-28.",
		"throughput from 23:31 UTC",
		"the case failed at 1421d8a",
		"after the two statements of 3751fddc0ffee",
		"as issue 17 found",
		"(Issue #4)",
		"see task 9",
		"fixed in #12.",
		"source /work/testenv.env",
		"eval $(cat …/testenv.env)",
		"cd /home/dev/fencelock",
		"/root/go/bin/fencelock",
	} {
		if !found(s, false) {
			t.Errorf("no rule finds %q", s)
		}
	}
	for _, s := range []string{
		"The token is 1795288654644607.",
		"a deadbeef value",
		"RFC 3339 times such as 15:04:05 are not in UTC words",
		"see [fencing](#fencing) and &#35; entities",
		"Go 1.26 and PostgreSQL 16",
		"the key jobs/daily",
		"port 2379",
	} {
		if found(s, false) {
			t.Errorf("a rule finds ordinary prose %q", s)
		}
	}
	if found("held by web1:4242/9f3a1c2b7d10.1", true) {
		t.Error("a hex owner id in a code block is taken for a commit hash")
	}
	if !found("held by web1:4242/9f3a1c2b7d10.1", false) {
		t.Error("a commit-hash-like word in prose is not found")
	}
}
