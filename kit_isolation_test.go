package fencelock_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A storeLib is the client library of one store, known by the module path
// prefix of its modules.
type storeLib struct {
	name   string
	prefix string
}

var (
	libPgx       = storeLib{"pgx, the PostgreSQL client", "github.com/jackc/"}
	libGoRedis   = storeLib{"go-redis, the Redis client", "github.com/redis/go-redis"}
	libEtcd      = storeLib{"the etcd client", "go.etcd.io/etcd"}
	libMongo     = storeLib{"mongo-driver, the MongoDB client", "go.mongodb.org/mongo-driver"}
	libGRPC      = storeLib{"gRPC", "google.golang.org/grpc"}
	libZookeeper = storeLib{"go-zookeeper, the ZooKeeper client", "github.com/go-zookeeper/"}

	storeLibs = []storeLib{libPgx, libGoRedis, libEtcd, libMongo, libGRPC, libZookeeper}
)

// repoPath matches a package or module path of this repository, other
// than the engine's, in the go command's output.
var repoPath = regexp.MustCompile(`github\.com/fencelock/fencelock/[A-Za-z0-9_./-]*[A-Za-z0-9_]`)

// isolatedKits are the fencing kits and the client libraries each may
// bring into its user's module graph: its own store's, and for etcd, gRPC
// too, which etcd's client is built on. module is "" for a kit in the root
// module.
var isolatedKits = []struct {
	name    string
	module  string
	pkg     string
	expects []storeLib
}{
	{"postgres", "github.com/fencelock/fencelock/kit/postgres", "github.com/fencelock/fencelock/kit/postgres", []storeLib{libPgx}},
	{"redis", "github.com/fencelock/fencelock/kit/redis", "github.com/fencelock/fencelock/kit/redis", []storeLib{libGoRedis}},
	{"etcd", "github.com/fencelock/fencelock/kit/etcd", "github.com/fencelock/fencelock/kit/etcd", []storeLib{libEtcd, libGRPC}},
	{"mongo", "github.com/fencelock/fencelock/kit/mongo", "github.com/fencelock/fencelock/kit/mongo", []storeLib{libMongo}},
	{"grpc", "github.com/fencelock/fencelock/kit/grpc", "github.com/fencelock/fencelock/kit/grpc", []storeLib{libGRPC}},
	{"httpfence", "", "github.com/fencelock/fencelock/kit/httpfence", nil},
	// The gocron adapters bring gocron, and no store's client.
	{"gocron", "github.com/fencelock/fencelock/kit/gocron", "github.com/fencelock/fencelock/kit/gocron", nil},
}

// TestKitIsolation builds, for each fencing kit, the module of a user who
// adopts that kit alone: a scratch module requiring the engine and the
// kit (replace lines pointing at this checkout, as TestInstallFromClone
// does for a backend), whose main package imports both. After go mod
// tidy, its module graph (go list -m all, outside the workspace) must hold
// the kit's own store client, and no other module of this repository and
// no other store's client library: a user of the Redis kit gets no pgx,
// etcd client, mongo-driver or gRPC. It fails if a kit imports another
// kit or a backend, if a kit's go.mod requires a module of the repository
// for its tests (requirements reach the user's graph whether or not the
// user builds the tests), or if the engine grows a dependency on a store.
func TestKitIsolation(t *testing.T) {
	if testing.Short() {
		t.Skip("resolves a module graph per kit with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("the go command is not on PATH")
	}
	clone, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, kit := range isolatedKits {
		t.Run(kit.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			gomod := "module example.com/kituser\n\ngo 1.26.0\n\nrequire github.com/fencelock/fencelock v0.0.0\n\n" +
				"replace github.com/fencelock/fencelock => " + clone + "\n"
			if kit.module != "" {
				rel := strings.TrimPrefix(kit.module, "github.com/fencelock/fencelock/")
				gomod += "\nrequire " + kit.module + " v0.0.0\n\nreplace " + kit.module + " => " + filepath.Join(clone, filepath.FromSlash(rel)) + "\n"
			}
			main := "package main\n\nimport (\n\t_ \"github.com/fencelock/fencelock\"\n\t_ \"" + kit.pkg + "\"\n)\n\nfunc main() {}\n"
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(main), 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(args ...string) string {
				t.Helper()
				cmd := exec.CommandContext(t.Context(), goBin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
				out, err := cmd.CombinedOutput()
				if err != nil {
					// A module of the repository the scratch module does not
					// replace cannot be resolved (it is not published): name
					// it as the isolation failure it is.
					for _, m := range slices.Compact(slices.Sorted(slices.Values(repoPath.FindAllString(string(out), -1)))) {
						if m != kit.pkg && m != kit.module {
							t.Errorf("a user of %s alone needs %s, a module of the repository beyond the engine and the kit: the kit imports it, or its go.mod requires it (for its tests, say)", kit.pkg, m)
						}
					}
					t.Fatalf("go %s in a module using only %s: %v\n%s\ngo.mod:\n%s", strings.Join(args, " "), kit.pkg, err, out, gomod)
				}
				return string(out)
			}
			run("mod", "tidy")
			graph := run("list", "-m", "all")
			seen := map[storeLib]bool{}
			for _, line := range strings.Split(strings.TrimSpace(graph), "\n") {
				path := strings.Fields(line)[0]
				switch {
				case path == "example.com/kituser", path == "github.com/fencelock/fencelock", kit.module != "" && path == kit.module:
					continue
				case strings.HasPrefix(path, "github.com/fencelock/"):
					t.Errorf("module graph of a user of %s alone holds %s: a module of the repository it did not ask for", kit.pkg, path)
					continue
				}
				for _, lib := range storeLibs {
					if !strings.HasPrefix(path, lib.prefix) {
						continue
					}
					seen[lib] = true
					if !slices.Contains(kit.expects, lib) {
						t.Errorf("module graph of a user of %s alone holds %s: %s, which that kit does not use", kit.pkg, path, lib.name)
					}
				}
			}
			// The kit's own store client must be there: otherwise the
			// scratch module did not use the kit, and the absences above
			// prove nothing.
			for _, lib := range kit.expects {
				if !seen[lib] {
					t.Errorf("module graph of a user of %s holds no module of %s, which the kit is built on: the scratch module did not pull the kit in\n%s", kit.pkg, lib.name, graph)
				}
			}
		})
	}
}
