package redisbench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

// scriptSetNX is raw's SET NX PX run as a one-call script: what running
// any script costs over the bare command, with nothing else changed.
var scriptSetNX = goredis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])`)

// The least a fenced lock can do, on two record layouts: refuse a held
// key, draw a token, store owner and token with the TTL; release compares
// owner and token, deletes and publishes (for waiters), as the backend's
// release does. No retry, metadata or overflow handling. string is a
// string record "token:len(owner):owner" (GET, INCR, SET PX), the
// backend's kind of record; hash is the backend's layout before the
// string record (HMGET, INCR, HSET, PEXPIRE).
var (
	stringAcquire = goredis.NewScript(`if redis.call('GET', KEYS[1]) then return false end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. ':' .. string.len(ARGV[1]) .. ':' .. ARGV[1], 'PX', ARGV[2])
return t`)
	stringRelease = goredis.NewScript(`if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. string.len(ARGV[2]) .. ':' .. ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'released')
return 1`)
	hashAcquire = goredis.NewScript(`if redis.call('HMGET', KEYS[1], 'owner', 'token')[1] then return false end
local t = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', t)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return t`)
	hashRelease = goredis.NewScript(`local cur = redis.call('HMGET', KEYS[1], 'owner', 'token')
if cur[1] ~= ARGV[2] or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'released')
return 1`)
)

// The least a fenced lock can write: one key per lock, never deleted,
// "<token>\n<deadline ms>\n<owner>", the deadline from the server's TIME;
// free when the deadline has passed or the owner is empty. Acquire reads
// the clock and the key and writes it once (no counter key: the token is
// the key's own); release checks token and owner, writes the key back
// free (keeping the token) and publishes. One write each, as raw; what it
// gives up (a key whose TTL cleans it up, so a crashed holder's record
// stays until the next acquire) is why the backend does not store this.
var (
	oneKeyAcquire = goredis.NewScript(`local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local cur = redis.call('GET', KEYS[1])
local tok = 0
if cur then
  local a = string.find(cur, '\n', 1, true)
  local b = string.find(cur, '\n', a + 1, true)
  tok = tonumber(string.sub(cur, 1, a - 1))
  if b < #cur and tonumber(string.sub(cur, a + 1, b - 1)) > now then return false end
end
tok = tok + 1
redis.call('SET', KEYS[1], string.format('%d', tok) .. '\n' .. string.format('%d', now + tonumber(ARGV[2])) .. '\n' .. ARGV[1])
return tok`)
	oneKeyRelease = goredis.NewScript(`local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local a = string.find(cur, '\n', 1, true)
local b = string.find(cur, '\n', a + 1, true)
if string.sub(cur, 1, a - 1) ~= ARGV[1] or string.sub(cur, b + 1) ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. '\n0\n')
redis.call('PUBLISH', KEYS[1], 'released')
return 1`)
)

// scripted is a lock whose acquire and release are the given scripts.
// With no release script the acquire is scriptSetNX's and the release is
// raw's compare-and-delete.
func scripted(name string, acquire, release *goredis.Script) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		rdb := client(b)
		counter := "bench-counter-" + benchkit.RandomHex()
		ms := strconv.FormatInt(ttl.Milliseconds(), 10)
		try := func(ctx context.Context, key string) (func() error, error) {
			owner := token()
			v, err := acquire.Run(ctx, rdb, []string{key, counter}, owner, ms).Result()
			if err == goredis.Nil {
				return nil, benchkit.ErrHeld
			}
			if err != nil {
				return nil, err
			}
			if release == nil {
				return func() error { return compareAndDelete.Run(ctx, rdb, []string{key}, owner).Err() }, nil
			}
			tok := strconv.FormatInt(v.(int64), 10)
			return func() error { return release.Run(ctx, rdb, []string{key}, tok, owner).Err() }, nil
		}
		return benchkit.Same(try, benchkit.Poll(try, 0, 0))
	}}
}

// backendShared is backendOnly with one backend (one client) for every
// goroutine, as raw has.
var backendShared = benchkit.BackendLib("fencelock-backend-shared", true, ttl, func(b *testing.B) func() (driver.Backend, error) {
	u := fencelockURL(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), u)
		return be, err
	}
})

// BenchmarkScriptCost splits the gap between raw and fencelock into its
// parts, in one interleaved run: raw-script is raw whose SET NX PX runs
// inside a one-call script (the cost of running a script at all);
// fenced-string and fenced-hash are the least a fenced lock can do on a
// string record and on the hash record of earlier versions; fenced-onekey
// the least a fenced lock can write (one write per acquire and per
// release, as raw); then the backend alone
// on one client, as raw has, and the whole client.
func BenchmarkScriptCost(b *testing.B) {
	libs := []benchkit.Lib{raw, scripted("raw-script", scriptSetNX, nil), scripted("fenced-string", stringAcquire, stringRelease),
		scripted("fenced-hash", hashAcquire, hashRelease), scripted("fenced-onekey", oneKeyAcquire, oneKeyRelease), backendScripts, backendShared, fencelockLib("fencelock", true)}
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { benchkit.Interleaved(b, g, 50*g, libs) })
	}
}

// backendScripts is the backend's own acquire and release scripts
// (backend/redis/lua), run as scripted's forms are: on one client, with
// none of the backend's Go code. Against fenced-string it is the cost of
// what the backend's Lua does more (the holder's retry, the counter's
// overflow check, metadata); against fencelock-backend-shared, the cost
// of the backend's Go code.
var backendScripts = benchkit.Lib{Name: "backend-scripts", Setup: func(b *testing.B) benchkit.Lockers {
	src := func(name string) *goredis.Script {
		p, err := os.ReadFile(filepath.Join("..", "..", "backend", "redis", "lua", name))
		if err != nil {
			b.Fatal(err)
		}
		return goredis.NewScript(string(p))
	}
	acquire, release := src("acquire.lua"), src("release.lua")
	rdb := client(b)
	counter := "bench-counter-" + benchkit.RandomHex()
	ms := strconv.FormatInt(ttl.Milliseconds(), 10)
	try := func(ctx context.Context, key string) (func() error, error) {
		owner := token()
		// The lock-delay marker beside the key; lock delay 0: none, as
		// the backend's default.
		v, err := acquire.Run(ctx, rdb, []string{key, counter, key + "-ended"}, owner, ms, "", "0").Result()
		if err != nil {
			return nil, err
		}
		tok, ok := v.(string)
		if !ok {
			return nil, benchkit.ErrHeld
		}
		head := tok + "\n" + owner + "\n"
		return func() error {
			return release.Run(ctx, rdb, []string{key, key + "-ended"}, head, key+"-released").Err()
		}, nil
	}
	return benchkit.Same(try, benchkit.Poll(try, 0, 0))
}}
