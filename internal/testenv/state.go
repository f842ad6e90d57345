package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Environment variables of the test environment.
const (
	// StateEnv names the state dir of the running servers.
	StateEnv = "FENCELOCK_TESTENV_STATE"
	// ScriptEnv is the absolute path of scripts/testenv, the wrapper
	// around this package's command; Up exports it for scripts that call it.
	ScriptEnv = "FENCELOCK_TESTENV"
)

// marker is the file that makes a directory a state dir.
const marker = ".fencelock-testenv"

// Var is one environment variable that Up exports.
type Var struct {
	Name, Value string
}

// EnvVar returns the environment variable holding the URL of the named
// server: FENCELOCK_TEST_ and the name upper-cased with - as _
// (FENCELOCK_TEST_ZOOKEEPER_STOCK for "zookeeper-stock").
func EnvVar(name string) string {
	return "FENCELOCK_TEST_" + strings.ReplaceAll(strings.ToUpper(name), "-", "_")
}

// WriteExports writes one `export NAME='value'` line per variable, quoted
// for a POSIX shell, so that `eval` of the output sets them.
func WriteExports(w io.Writer, vars []Var) error {
	for _, v := range vars {
		if _, err := fmt.Fprintf(w, "export %s=%s\n", v.Name, shellQuote(v.Value)); err != nil {
			return err
		}
	}
	return nil
}

// ParseExports reads the lines WriteExports writes (blank lines are
// allowed) and returns the variables in order.
func ParseExports(r io.Reader) ([]Var, error) {
	var vars []Var
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		kv, ok := strings.CutPrefix(line, "export ")
		k, v, ok2 := strings.Cut(kv, "=")
		if !ok || !ok2 || !validVarName(k) {
			return vars, fmt.Errorf("testenv: not an export line: %q", line)
		}
		uv, err := shellUnquote(v)
		if err != nil {
			return vars, fmt.Errorf("testenv: line %q: %w", line, err)
		}
		vars = append(vars, Var{k, uv})
	}
	return vars, sc.Err()
}

func validVarName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// shellQuote quotes s in single quotes; each quote inside ends the quoted
// part, is escaped with a backslash, and starts a new one.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellUnquote undoes the quoting of a shell word: single-quoted parts,
// backslash escapes and plain characters (what shellQuote and bash's
// printf %q write; $'...' is not supported).
func shellUnquote(s string) (string, error) {
	var b strings.Builder
	for len(s) > 0 {
		switch c := s[0]; {
		case c == '\'':
			end := strings.IndexByte(s[1:], '\'')
			if end < 0 {
				return "", errors.New("unterminated quote")
			}
			b.WriteString(s[1 : 1+end])
			s = s[end+2:]
		case c == '\\':
			if len(s) < 2 {
				return "", errors.New("trailing backslash")
			}
			b.WriteByte(s[1])
			s = s[2:]
		case c == '"' || c == '$' || c == '`' || c == ' ' || c == '\t':
			return "", fmt.Errorf("unsupported shell syntax in %q", s)
		default:
			b.WriteByte(c)
			s = s[1:]
		}
	}
	return b.String(), nil
}

// stateOK reports whether dir is a state dir made by Up.
func stateOK(dir string) bool {
	if dir == "" || !filepath.IsAbs(dir) {
		return false
	}
	fi, err := os.Stat(filepath.Join(dir, marker))
	return err == nil && !fi.IsDir()
}

// loadVars reads a server's saved variables: KEY=VALUE lines, VALUE quoted
// as a shell word.
func loadVars(file string) (map[string]string, error) {
	vars := map[string]string{}
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return vars, nil
	}
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !validVarName(k) {
			return nil, fmt.Errorf("testenv: %s: bad line %q", file, line)
		}
		uv, err := shellUnquote(v)
		if err != nil {
			return nil, fmt.Errorf("testenv: %s: line %q: %w", file, line, err)
		}
		vars[k] = uv
	}
	return vars, nil
}

// storeVars writes vars to file (through a temporary file and a rename).
func storeVars(file string, vars map[string]string) error {
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, shellQuote(vars[k]))
	}
	return writeFileAtomic(file, b.String())
}

func writeFileAtomic(file, content string) error {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readTrimmed returns the content of a file without surrounding space, ""
// when it cannot be read.
func readTrimmed(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// tailFile returns the last n lines of a file, or a note that it is empty.
func tailFile(p string, n int) string {
	b, err := os.ReadFile(p)
	if err != nil || len(b) == 0 {
		return fmt.Sprintf("(log %s is empty or missing)", p)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprintf("---- last lines of %s ----\n| %s\n---- end of %s ----", p, strings.Join(lines, "\n| "), p)
}
