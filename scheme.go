package fencelock

import (
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/driver"
)

const modulePath = "github.com/fencelock/fencelock"

// packageOf maps the URL schemes of the project's own backends to the
// package whose import registers them, so that Open can say which import
// a program lacks.
var packageOf = map[string]string{
	"postgres": "backend/postgres", "postgresql": "backend/postgres",
	"redis": "backend/redis", "rediss": "backend/redis",
	"redis+cluster": "backend/redis", "rediss+cluster": "backend/redis",
	"redis+sentinel": "backend/redis", "rediss+sentinel": "backend/redis",
	"etcd": "backend/etcd", "etcds": "backend/etcd",
	"zk":      "backend/zookeeper",
	"mongodb": "backend/mongo", "mongodb+srv": "backend/mongo",
	"file": "backend/file",
	"dual": "migrate",
	"mem":  "backend/memory",
}

// schemeAliases are names users write for a scheme spelt otherwise.
var schemeAliases = map[string]string{
	"pg": "postgres", "psql": "postgres", "postgre": "postgres", "pgsql": "postgres",
	"zookeeper": "zk", "zoo": "zk", "zoo+keeper": "zk",
	"mongo": "mongodb", "mongo+srv": "mongodb+srv",
	"memory": "mem", "etcd3": "etcd", "etcdv3": "etcd", "sentinel": "redis+sentinel",
}

// unknownScheme is the error for a URL whose scheme no backend has
// registered. It names what to do: the import a known scheme needs, the
// scheme a misspelt one probably meant, or the missing "SCHEME://" of a
// URL written without one.
func unknownScheme(scheme, rawURL string) error {
	lower := strings.ToLower(scheme)
	shown := driver.RedactURL(rawURL)
	if pkg, ok := packageOf[lower]; ok {
		return fmt.Errorf("%w %q in %s: the %s backend is not linked into this program; add import _ %q",
			ErrUnknownScheme, scheme, shown, pkg[strings.LastIndexByte(pkg, '/')+1:], modulePath+"/"+pkg)
	}
	if scheme == "" || !strings.Contains(rawURL, "://") {
		return fmt.Errorf("%w: %s has no scheme; write the URL as SCHEME://[USER[:PASSWORD]@]HOST/..., with one of: %s",
			ErrUnknownScheme, shown, strings.Join(Schemes(), ", "))
	}
	if guess := suggestScheme(lower); guess != "" {
		return fmt.Errorf("%w %q in %s; did you mean %s://?", ErrUnknownScheme, scheme, shown, guess)
	}
	return fmt.Errorf("%w %q in %s; known schemes: %s", ErrUnknownScheme, scheme, shown, strings.Join(Schemes(), ", "))
}

// suggestScheme returns the registered or known scheme that s most
// probably meant, or "" if none is close.
func suggestScheme(s string) string {
	if a, ok := schemeAliases[s]; ok {
		return a
	}
	best, bestD := "", 3
	cands := Schemes()
	for k := range packageOf {
		cands = append(cands, k)
	}
	for _, k := range cands {
		d := driver.EditDistance(s, k)
		if d < bestD || d == bestD && k < best {
			best, bestD = k, d
		}
	}
	if bestD > 2 || bestD*2 > len(s) {
		return ""
	}
	return best
}
