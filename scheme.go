package fencelock

import (
	"fmt"
	"net/url"
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
	"mysql": "backend/mysql", "mariadb": "backend/mysql",
	"nats": "backend/nats", "nats+tls": "backend/nats",
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
		return fmt.Errorf("%w: %s has no scheme; write the URL as SCHEME://[USER[:PASSWORD]@]HOST/...%s",
			ErrUnknownScheme, shown, schemeFromPort(rawURL))
	}
	if guess := suggestScheme(lower); guess != "" {
		return fmt.Errorf("%w %q in %s; did you mean %s://?", ErrUnknownScheme, scheme, shown, guess)
	}
	return fmt.Errorf("%w %q in %s; known schemes: %s", ErrUnknownScheme, scheme, shown, mainSchemes())
}

// mainSchemes names the schemes a user most probably wants, one per
// backend (not every variant, such as rediss+sentinel), plus any scheme a
// third-party backend registered: short enough for a one-line error.
func mainSchemes() string {
	names := []string{"postgres", "redis", "etcd", "zk", "mongodb", "mysql", "nats", "file", "mem", "dual"}
	for _, s := range Schemes() {
		if _, ours := packageOf[s]; !ours {
			names = append(names, s)
		}
	}
	return strings.Join(names, ", ") + " (and variants such as rediss, etcds, mongodb+srv)"
}

// defaultPorts maps a store's well-known port to its scheme, so that a URL
// written without a scheme ("localhost:6379") is told the one it lacks.
var defaultPorts = map[string]string{
	"5432": "postgres", "6379": "redis", "26379": "redis+sentinel",
	"2379": "etcd", "2181": "zk", "27017": "mongodb", "4222": "nats",
	"3306": "mysql",
}

// schemeFromPort completes the error for rawURL, a URL without a scheme:
// the URL with the scheme its port suggests (credentials redacted), or
// the list of schemes.
func schemeFromPort(rawURL string) string {
	hostPort := rawURL[strings.LastIndexByte(rawURL, '@')+1:]
	if i := strings.IndexAny(hostPort, "/?#"); i >= 0 {
		hostPort = hostPort[:i]
	}
	port := hostPort[strings.LastIndexByte(hostPort, ':')+1:]
	if scheme, ok := defaultPorts[port]; ok {
		fixed := scheme + "://" + rawURL
		if u, err := url.Parse(fixed); err == nil && u.Host != "" {
			return fmt.Sprintf("; %s is the %s port: did you mean %s?", port, scheme, driver.RedactURL(fixed))
		}
		return fmt.Sprintf("; %s is the %s port: did you mean %s://?", port, scheme, scheme)
	}
	return "; SCHEME is one of " + mainSchemes()
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
