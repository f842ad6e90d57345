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
// owner) and removes them before this package sees the URL.
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
// default writes to standard error, a line for every failed dial while a
// server is down. This package replaces that default, when it is
// initialised, with a logger that drops every line, so that it never
// writes to the program's standard error. A program that wants go-redis's
// lines calls redis.SetLogger in main (or later): its logger is kept, and
// receives the lines about the backend's connections too. One set in the
// init function of a package initialised before this one is replaced.
//
// # Design
//
// Each lock key K lives in three Redis names that share one hash tag, so
// they share a Cluster slot and one Lua script may touch them together:
//
//	{fencelock:K}:lock      string "<token>\n<owner>\n<meta>", with the lease's TTL
//	{fencelock:K}:token     the key's fencing-token counter; never expires
//	{fencelock:K}:released  pub/sub channel a release publishes on
//
// ('%', '{' and '}' in K are percent-escaped, so a key cannot move the hash
// tag; "fencelock" is Options.Prefix.) Six Lua scripts, embedded from
// lua/*.lua and run with EVALSHA (EVAL when the server answers NOSCRIPT,
// e.g. after SCRIPT FLUSH or a restart), do all the work, each in one round
// trip and atomically:
//
//   - acquire: if the lock is missing (expired locks are missing: Redis's
//     own clock judges expiry), INCR the counter and SET the record (token,
//     owner and the metadata, if any) with PX; if the same owner holds it
//     (a retried request), extend it, replace its metadata and return its
//     token; otherwise return the holder and its PTTL.
//   - renew: if owner and token match, PEXPIRE; with rotation take a new
//     token from the counter, and with the set-metadata flag replace the
//     metadata, rewriting the record (same script, after the check). It
//     never creates a lock.
//   - release: if owner and token match, DEL and PUBLISH on the release
//     channel. The counter stays, so tokens keep increasing.
//   - inspect, force (DEL whoever holds it, PUBLISH, counter kept).
//   - floor: raise the counter to a floor (RaiseFloor), never lower it.
//
// Tokens never pass through a Lua number (a double) where it is not
// exact: the scripts format INCR's reply with %d while it is below 2^53
// (where a double is exact) and above that read the new value back with
// GET, as a decimal string; tokens are stored and compared as strings. Tokens are exact up to 2^63-1, the
// largest integer Redis holds; at that point Acquire and rotation are
// refused with ErrTokenOverflow.
//
// # Capabilities
//
// Watcher: one pub/sub connection per Backend (opened by the first wait),
// one channel per awaited key; a notification wakes one local waiter of the
// key, the longest-waiting, not all of them. BatchRenewer: a client's
// renewals go out as one pipeline of EVALSHAs. ForceReleaser, Describer.
// Not a LossNotifier: a holder learns of a force-release at its next
// renewal. Expiry is not pushed either: a waiter that was told the holder's
// remaining TTL sleeps that long.
//
// # What Redis does and does not promise
//
// A lock is only as safe as the Redis that stores it. New checks the
// server's settings and reports what it finds in Describe().Warnings and in
// a log warning:
//
//   - Fencing tokens survive a restart only with appendonly yes and
//     appendfsync always. Without persistence a restart resets every
//     counter: tokens start again from 1.
//   - maxmemory-policy allkeys-* may evict counters (tokens go backwards)
//     and locks; volatile-* may evict live locks. Use noeviction.
//   - Replication (replicas, Sentinel, Cluster) is asynchronous: after a
//     failover the new primary may lack the last tokens and locks, so two
//     holders can overlap and tokens can repeat. This backend does not use
//     WAIT and does not implement Redlock.
//
// Counters never expire: each key ever locked leaves one small string key.
// Deleting counters breaks fencing for those keys.
package redis
