// Package redis is fencelock's Redis backend, on github.com/redis/go-redis/v9.
//
// Import it for its side effect to make fencelock.Open understand redis://,
// rediss://, redis+sentinel:// and redis+cluster:// URLs (see URLs), or
// build a Backend on a client you own with New:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"}) // go-redis
//	b, err := fencelockredis.New(ctx, rdb, nil)
//	c, err := fencelock.New(b, nil)
//
// Open opens a Backend on a URL, with a client of its own that Close
// closes; New never closes the caller's client. See
// https://github.com/fencelock/fencelock/blob/main/docs/backends/redis.md
// for the guarantees, the caveats and the design.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	redis://[user:password@]host[:port][/db][?params]                   one server
//	redis+sentinel://[user:password@]host:port[,host:port...]/master[/db][?params]  Sentinel
//	redis+cluster://[user:password@]host:port[,host:port...][?params]    Cluster
//
// and rediss://, rediss+sentinel:// and rediss+cluster://, the same over
// TLS; for example
//
//	redis+sentinel://app:s3cret@sentinel1:26379,sentinel2:26379/mymaster/2?prefix=myapp&sentinel_password=s3cret2
//
// Schemes are case-insensitive. The first host's port defaults to 6379
// (give a Sentinel's, usually 26379); every further host must name its
// port. db defaults to 0 (a Cluster has only 0, so its URL has no path).
// The user and password are the Redis server's (for Sentinel, the
// primary's and replicas'). Parameters of this package:
//
//   - prefix: Options.Prefix (default "fencelock"; may not be empty).
//   - skip_checks: Options.SkipChecks (default false: New reads the
//     server's settings; see below).
//   - wait_replicas: Options.WaitReplicas (default 0): each grant and
//     renewal counts only once that many replicas acknowledged it (WAIT);
//     a grant they do not acknowledge in time is refused, its record
//     removed, with a *ReplicaAckError.
//   - wait_timeout: Options.WaitTimeout, a Go duration (default 1s).
//   - sentinel_username and sentinel_password: the Sentinels' own
//     credentials (Sentinel schemes only; default none).
//
// Every other parameter goes to go-redis's URL parser (dial_timeout,
// read_timeout, write_timeout, pool_size, protocol, client_name,
// skip_verify, db, …, with go-redis's defaults), which rejects the ones it
// does not know; addr and master_name are refused on the Sentinel and
// Cluster schemes, whose hosts and master name are in the URL itself. The
// client is always made with go-redis's ContextTimeoutEnabled (whatever
// context_timeout_enabled says), so that every call returns by its
// context's deadline even when the server does not answer: a renewal must
// never outlast the engine's deadline for it. Unless the URL says
// otherwise (max_retries; dialer_retries for Sentinel and Cluster), the
// client dials once per attempt and retries a command once, so that a
// server refusing connections is reported within milliseconds, not after
// go-redis's rounds of dials and retries (about 2s, more through a
// Sentinel); the engine decides whether to try again. fencelock.Open also accepts
// the engine's parameters (ttl, renew_interval, margin, rotate_every,
// owner, lock_delay, require) and removes them before this package sees the URL.
//
// No credential from the URL appears in an error or a log: URLs are shown
// through driver.RedactURL (the password, and the value of
// sentinel_password and of any parameter whose name driver.IsSecretParam
// names, become "xxxxx"), and go-redis's errors, which may quote a value,
// pass through driver.RedactText. A URL that cannot be used, a bad port
// included, is an *InvalidOptionError.
//
// # Logging
//
// go-redis has one logger for the whole process (redis.SetLogger), whose
// default writes to standard error. When this package is initialised it
// replaces that default with a logger that drops every line, so the
// backend never writes to the program's standard error; a logger the
// program sets with redis.SetLogger in main (or later) replaces it in turn
// and receives go-redis's lines, those about the backend's connections
// included.
package redis
