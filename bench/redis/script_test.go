package redisbench

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// scriptLoops is how many acquisitions one EVAL of BenchmarkAcquireScript
// makes.
const scriptLoops = 2000

// loopScript wraps an acquire body (a script over KEYS[1..3],
// ARGV[1..4]) in a Lua function and calls it scriptLoops times on fresh
// keys, each followed by a DEL of the lock, timing the loop with the
// server's TIME: the server's own cost of an acquisition, without the
// network, the client or the fsync that follows a write command.
func loopScript(body, tag string) string {
	r := strings.NewReplacer("KEYS[1]", "k1", "KEYS[2]", "k2", "KEYS[3]", "k3", "ARGV[1]", "a1", "ARGV[2]", "a2", "ARGV[3]", "a3", "ARGV[4]", "a4")
	return "local function acq(k1, k2, k3, a1, a2, a3, a4)\n" + r.Replace(body) + "\nend\n" +
		"local t = redis.call('TIME')\n" +
		"for i = 1, tonumber(ARGV[1]) do local k = '{' .. ARGV[2] .. '" + tag + ":' .. i .. '}' " +
		"acq(k .. ':lock', k .. ':token', k .. ':ended', 'owner', '10000', '', '0') redis.call('DEL', k .. ':lock') end\n" +
		"local u = redis.call('TIME')\n" +
		"for i = 1, tonumber(ARGV[1]) do redis.call('DEL', '{' .. ARGV[2] .. '" + tag + ":' .. i .. '}:token') end\n" +
		"return (u[1] - t[1]) * 1000000 + (u[2] - t[2])"
}

// rawLoop is the same loop on SET NX PX: the floor of any Redis lock.
const rawLoop = `local t = redis.call('TIME')
for i = 1, tonumber(ARGV[1]) do local k = '{' .. ARGV[2] .. 'raw:' .. i .. '}:lock'
  redis.call('SET', k, 'owner', 'NX', 'PX', 10000) redis.call('DEL', k) end
local u = redis.call('TIME')
return (u[1] - t[1]) * 1000000 + (u[2] - t[2])`

// BenchmarkAcquireScript measures, inside the server, what one acquisition
// of a free key costs with fencelock's acquire script (read from
// backend/redis/lua/acquire.lua), with its earlier five-call form (a GET
// of the counter after every INCR, which the script now needs only from
// 2^53 on) and with SET NX PX, each followed by a DEL. The three loops
// alternate, b.N rounds; it reports the minimum and median µs per
// acquisition of each over the rounds (the minimum is the least disturbed
// by other load) and the ratios of the medians. Run it with -benchtime 30x.
func BenchmarkAcquireScript(b *testing.B) {
	src, err := os.ReadFile("../../backend/redis/lua/acquire.lua")
	if err != nil {
		b.Fatal(err)
	}
	current := string(src)
	const exactRead = "local tok\nif r < 9007199254740992 then\n  tok = string.format('%d', r)\nelse\n  tok = redis.call('GET', KEYS[2])\nend\n"
	if !strings.Contains(current, exactRead) {
		b.Fatal("acquire.lua no longer has the token read this benchmark replaces for its five-call form")
	}
	fiveCalls := strings.Replace(current, exactRead, "local tok = redis.call('GET', KEYS[2])\n", 1)
	rdb := client(b)
	ctx := context.Background()
	run := []struct {
		name, src string
		us        []float64
	}{
		{name: "raw-set-nx", src: rawLoop},
		{name: "acquire-5calls", src: loopScript(fiveCalls, "five")},
		{name: "acquire", src: loopScript(current, "cur")},
	}
	prefix := "bench-script-" + benchkit.RandomHex()
	b.ResetTimer()
	for range b.N {
		for i := range run {
			v, err := rdb.Eval(ctx, run[i].src, nil, scriptLoops, prefix).Int64()
			if err != nil {
				b.Fatal(err)
			}
			run[i].us = append(run[i].us, float64(v)/scriptLoops)
		}
	}
	b.StopTimer()
	med := map[string]float64{}
	for _, r := range run {
		slices.Sort(r.us)
		med[r.name] = r.us[len(r.us)/2]
		b.ReportMetric(r.us[0], r.name+"-min-µs")
		b.ReportMetric(med[r.name], r.name+"-median-µs")
	}
	b.ReportMetric(med["acquire"]/med["acquire-5calls"], "acquire/5calls")
	b.ReportMetric(med["acquire"]/med["raw-set-nx"], "acquire/raw")
}
