// Package fencingdoc reads docs/fencing.md for the tests that hold the
// fencing rule and its documented patterns to each other: fencelock.Fence
// and every pattern on that page (PostgreSQL SQL, psql, Redis Lua) are run
// through the page's own table of cases, using the page's own code, so the
// page cannot drift from what is tested.
//
// Blocks are marked with an HTML comment on the line before them:
// "<!-- fencing:NAME -->" followed by a fenced code block (its text is the
// block) or by a Markdown table (the cases, NAME "cases").
package fencingdoc

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Case is one row of the cases table: a write of Token by Holder, and
// whether the rule accepts it. Cases run in order against one resource.
type Case struct {
	Step   int
	Token  uint64
	Holder string
	Accept bool
	Why    string
}

// Doc is what a page holds under fencing markers.
type Doc struct {
	// Blocks maps a marker's NAME to the text of the code block after it.
	Blocks map[string]string
	// Cases is the table marked "cases", if any.
	Cases []Case
}

// Block returns the code block marked name, or an error naming the file.
func (d *Doc) Block(name string) (string, error) {
	b, ok := d.Blocks[name]
	if !ok {
		return "", fmt.Errorf("fencingdoc: no block marked fencing:%s", name)
	}
	return b, nil
}

// RepoFile returns the path of a file given relative to the repository's
// root (the directory of this package's grandparent), wherever the test
// that asks runs from.
func RepoFile(rel string) string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..", filepath.FromSlash(rel))
}

// Load reads the markers of the Markdown file at path.
func Load(path string) (*Doc, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d := &Doc{Blocks: map[string]string{}}
	sc := bufio.NewScanner(f)
	line := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		line++
		return sc.Text(), true
	}
	for {
		l, ok := next()
		if !ok {
			break
		}
		name, ok := marker(l)
		if !ok {
			continue
		}
		if _, dup := d.Blocks[name]; dup || (name == "cases" && d.Cases != nil) {
			return nil, fmt.Errorf("%s:%d: fencing:%s marked twice", path, line, name)
		}
		l, _ = next()
		switch {
		case strings.HasPrefix(l, "```"):
			var body []string
			for {
				l, ok := next()
				if !ok {
					return nil, fmt.Errorf("%s: block fencing:%s not closed", path, name)
				}
				if strings.HasPrefix(l, "```") {
					break
				}
				body = append(body, l)
			}
			d.Blocks[name] = strings.Join(body, "\n") + "\n"
		case name == "cases" && strings.HasPrefix(l, "|"):
			if _, ok := next(); !ok { // the |---| line
				return nil, fmt.Errorf("%s: table fencing:cases has no rows", path)
			}
			for {
				l, ok := next()
				if !ok || !strings.HasPrefix(l, "|") {
					break
				}
				c, err := parseCase(l)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %v", path, line, err)
				}
				d.Cases = append(d.Cases, c)
			}
			if len(d.Cases) == 0 {
				return nil, fmt.Errorf("%s: table fencing:cases has no rows", path)
			}
		case strings.HasPrefix(l, ">"):
			// A quoted statement (the rule): kept as text.
			var body []string
			for ; ok && strings.HasPrefix(l, ">"); l, ok = next() {
				body = append(body, strings.TrimSpace(strings.TrimPrefix(l, ">")))
			}
			d.Blocks[name] = strings.Join(body, " ")
		default:
			return nil, fmt.Errorf("%s:%d: fencing:%s is followed by neither a code block, a table nor a quote", path, line, name)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return d, nil
}

func marker(l string) (string, bool) {
	l = strings.TrimSpace(l)
	if !strings.HasPrefix(l, "<!-- fencing:") || !strings.HasSuffix(l, "-->") {
		return "", false
	}
	return strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, "<!-- fencing:"), "-->")), true
}

// parseCase reads "| step | token | holder | accepted or refused | why |".
func parseCase(l string) (Case, error) {
	cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
	if len(cells) != 5 {
		return Case{}, fmt.Errorf("case row has %d cells, want 5: %q", len(cells), l)
	}
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	var c Case
	var err error
	if c.Step, err = strconv.Atoi(cells[0]); err != nil {
		return Case{}, fmt.Errorf("step %q: %v", cells[0], err)
	}
	if c.Token, err = strconv.ParseUint(cells[1], 10, 64); err != nil {
		return Case{}, fmt.Errorf("token %q: %v", cells[1], err)
	}
	c.Holder = cells[2]
	switch cells[3] {
	case "accepted":
		c.Accept = true
	case "refused":
	default:
		return Case{}, fmt.Errorf("outcome %q: want accepted or refused", cells[3])
	}
	c.Why = cells[4]
	return c, nil
}
