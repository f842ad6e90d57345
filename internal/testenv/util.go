package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// copyTree copies the directories and regular files under src to dst
// (made if missing) with their permission bits, then calls chown (if not
// nil) on each copy.
func copyTree(src, dst string, chown func(string) error) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, info.Mode().Perm()); err != nil {
				return err
			}
			if err := os.Chmod(target, info.Mode().Perm()); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(p, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil // PostgreSQL's data dir has no links or devices
		}
		if chown != nil {
			return chown(target)
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// redactArgs returns argv for a log line, with the password of any URL in
// an argument (-flag=URL or URL) replaced by xxxxx.
func redactArgs(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		prefix, val := "", a
		if strings.HasPrefix(a, "-") {
			if k, v, ok := strings.Cut(a, "="); ok {
				prefix, val = k+"=", v
			}
		}
		if u, err := url.Parse(val); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				a = prefix + u.Redacted()
			}
		}
		out[i] = a
	}
	return out
}
