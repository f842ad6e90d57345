package suite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	etcdfence "github.com/fencelock/fencelock/kit/etcd"
	pgfence "github.com/fencelock/fencelock/kit/postgres"
	redisfence "github.com/fencelock/fencelock/kit/redis"
)

// fHolderPauseKit is the holder-pause fault with a real resource behind
// the fenced server: every lock write goes, through the kit a user would
// call, to the backend's own server (a PostgreSQL table with pgfence.Tx,
// a Redis key with redisfence.Do, an etcd key with etcdfence.Txn), and
// the store's answer is the decision the checker judges.
const fHolderPauseKit = "holder-pause-kit"

// FaultHolderPauseKit is fHolderPauseKit, for Config.Faults (postgres://,
// redis:// and etcd:// backends).
const FaultHolderPauseKit = fHolderPauseKit

// kitStore is a fence.Store over one of the kits. Each write is a fenced
// write of one data record (a row, a list element, a key) under the
// cell's own resource names; landed counts the data records, so that the
// cell can check that exactly the accepted writes changed the store.
type kitStore struct {
	name   string // the kit, for the report
	write  func(ctx context.Context, resource, lease string, token fencelock.Token) error
	landed func(ctx context.Context, resource string) (int, error)
	close  func()
	prefix string // this cell's resource names: prefix + key
}

// Write implements fence.Store.
func (k *kitStore) Write(ctx context.Context, key, lease string, token uint64) (bool, error) {
	err := k.write(ctx, k.prefix+key, lease, fencelock.Token(token))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fencelock.ErrStaleToken):
		return false, nil
	default:
		return false, err
	}
}

// kitFor returns the kit store over the backend's own server, or a reason
// there is none for its scheme.
func kitFor(ctx context.Context, be *backendEnv) (*kitStore, string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "fencelock-safety-" + hex.EncodeToString(b[:]) + "/"
	u, err := url.Parse(be.url)
	if err != nil {
		return nil, "", errors.New("the URL does not parse: " + driver.RedactText(err.Error(), be.url))
	}
	switch be.scheme {
	case "postgres", "postgresql":
		k, err := pgKit(ctx, u)
		if k != nil {
			k.prefix = prefix
		}
		return k, "", err
	case "redis":
		k, err := redisKit(ctx, u)
		if k != nil {
			k.prefix = prefix
		}
		return k, "", err
	case "etcd":
		k, err := etcdKit(ctx, u)
		if k != nil {
			k.prefix = prefix
		}
		return k, "", err
	}
	return nil, "no fencing kit for " + be.scheme + "://", nil
}

// pgKit writes one row per accepted write to a data table, fenced by
// pgfence.Tx (the fence row and the data row in one transaction).
func pgKit(ctx context.Context, u *url.URL) (*kitStore, error) {
	q := url.Values{}
	if m := u.Query().Get("sslmode"); m != "" {
		q.Set("sslmode", m)
	}
	cu := *u
	cu.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, cu.String())
	if err != nil {
		return nil, errors.New("kit/postgres: " + driver.RedactText(err.Error(), u.String()))
	}
	fail := func(err error) (*kitStore, error) {
		pool.Close()
		return nil, fmt.Errorf("kit/postgres: %w", err)
	}
	if err := pgfence.EnsureTable(ctx, pool); err != nil {
		return fail(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS fencelock_safety_writes (resource text NOT NULL, lease text NOT NULL, token numeric NOT NULL)`); err != nil {
		return fail(err)
	}
	return &kitStore{
		name: "kit/postgres (pgfence.Tx)",
		write: func(ctx context.Context, resource, lease string, token fencelock.Token) error {
			return pgfence.Tx(ctx, pool, resource, token, lease, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO fencelock_safety_writes (resource, lease, token) VALUES ($1, $2, $3)`, resource, lease, uint64(token))
				return err
			})
		},
		landed: func(ctx context.Context, resource string) (int, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM fencelock_safety_writes WHERE resource = $1`, resource).Scan(&n)
			return n, err
		},
		close: pool.Close,
	}, nil
}

// redisKit appends one element per accepted write to a list in the
// resource's hash tag, fenced by redisfence.Do.
func redisKit(ctx context.Context, u *url.URL) (*kitStore, error) {
	cu := *u
	cu.RawQuery = ""
	opt, err := goredis.ParseURL(cu.String())
	if err != nil {
		return nil, errors.New("kit/redis: " + driver.RedactText(err.Error(), u.String()))
	}
	rdb := goredis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("kit/redis: %w", err)
	}
	list := func(resource string) string { return "{" + resource + "}:fencelock-safety:writes" }
	return &kitStore{
		name: "kit/redis (redisfence.Do)",
		write: func(ctx context.Context, resource, lease string, token fencelock.Token) error {
			_, err := redisfence.Do(ctx, rdb, resource, token, lease,
				redisfence.Cmd{Name: "RPUSH", Keys: []string{list(resource)}, Args: []any{fmt.Sprintf("%s/%d", lease, token)}})
			return err
		},
		landed: func(ctx context.Context, resource string) (int, error) {
			n, err := rdb.LLen(ctx, list(resource)).Result()
			return int(n), err
		},
		close: func() {
			_ = rdb.Close()
		},
	}, nil
}

// etcdKit puts one key per accepted write under the resource's data
// prefix, fenced by etcdfence.Txn.
func etcdKit(ctx context.Context, u *url.URL) (*kitStore, error) {
	var eps []string
	for _, h := range strings.Split(u.Host, ",") {
		eps = append(eps, "http://"+h)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Context: ctx})
	if err != nil {
		return nil, fmt.Errorf("kit/etcd: %w", err)
	}
	data := func(resource string) string { return "fencelock-safety-writes/" + resource + "/" }
	return &kitStore{
		name: "kit/etcd (etcdfence.Txn)",
		write: func(ctx context.Context, resource, lease string, token fencelock.Token) error {
			// One key per write: the lease, and a nanosecond stamp for
			// a lease's writes with one token.
			k := fmt.Sprintf("%s%s/%d/%d", data(resource), lease, token, time.Now().UnixNano())
			_, err := etcdfence.Txn(ctx, cli, resource, token, lease, clientv3.OpPut(k, ""))
			return err
		},
		landed: func(ctx context.Context, resource string) (int, error) {
			resp, err := cli.Get(ctx, data(resource), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return int(resp.Count), nil
		},
		close: func() {
			_ = cli.Close()
		},
	}, nil
}

// checkKitStore compares the store with the fence's log after a kit cell:
// the store and the rule agreed on every write, and each key's resource
// holds exactly as many data records as the fence accepted writes.
func checkKitStore(ctx context.Context, c *cell, k *kitStore) error {
	var errs []error
	for _, f := range c.fence.StoreFaults() {
		errs = append(errs, errors.New(k.name+": "+f))
	}
	accepted := map[string]int{}
	for _, ev := range c.fence.Log() {
		if ev.Accepted {
			accepted[ev.Key]++
		}
	}
	for key, want := range accepted {
		got, err := k.landed(ctx, k.prefix+key)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: counting the writes that landed for %s: %w", k.name, key, err))
		case got != want:
			errs = append(errs, fmt.Errorf("%s: %d writes landed in the store for %s; the fence log accepted %d (a refused write changed the store, or an accepted one did not land)", k.name, got, key, want))
		}
	}
	return errors.Join(errs...)
}
