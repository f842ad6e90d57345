package redis

import (
	"strings"
	"testing"
)

var oddKeys = []string{"a b", "ключ/значение", "{tag}", "{", "}", "}{", "{}", "a{b}c", "%", "%7B", "%25", "100%", "*", "?", "[a-z]", `\back`, "^", "a:b", "}:lock", "x}:token", "emoji-🔒", "plain"}

func TestCRC16KnownValues(t *testing.T) {
	// Reference values from the Redis Cluster specification and redis-cli
	// CLUSTER KEYSLOT.
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16(123456789) = %#x; want 0x31c3", got)
	}
	for key, want := range map[string]int{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443, "foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d; want %d", key, got, want)
		}
	}
}

// TestHashTagOddKeys: a lock's hash, counter and channel share a Cluster
// slot whatever the key holds, and the hash tag is the whole escaped key.
func TestHashTagOddKeys(t *testing.T) {
	ks := keyspace{prefix: DefaultPrefix}
	for _, k := range oddKeys {
		lock, counter, channel := ks.names(k)
		if slot(lock) != slot(counter) || slot(lock) != slot(channel) {
			t.Errorf("key %q: slots lock %d, counter %d, channel %d differ", k, slot(lock), slot(counter), slot(channel))
		}
		tag := DefaultPrefix + ":" + escapeKey(k)
		if slot(lock) != int(crc16(tag)&16383) {
			t.Errorf("key %q: hash tag is not the whole escaped key %q (lock name %q)", k, tag, lock)
		}
		if strings.Count(lock, "{") != 1 || strings.Count(lock, "}") != 1 {
			t.Errorf("key %q: lock name %q has braces besides the tag's", k, lock)
		}
	}
}

func TestEscapeRoundTrip(t *testing.T) {
	ks := keyspace{prefix: "p"}
	seen := map[string]string{}
	for _, k := range oddKeys {
		e := escapeKey(k)
		back, ok := unescapeKey(e)
		if !ok || back != k {
			t.Errorf("unescape(escape(%q)) = %q, %v", k, back, ok)
		}
		if other, dup := seen[e]; dup {
			t.Errorf("keys %q and %q escape alike: %q", k, other, e)
		}
		seen[e] = k
		if got, ok := ks.keyOf(ks.lockName(k)); !ok || got != k {
			t.Errorf("keyOf(lockName(%q)) = %q, %v", k, got, ok)
		}
		// Escaping preserves prefixes, which List's pattern relies on.
		for i := range len(k) {
			if !strings.HasPrefix(e, escapeKey(k[:i])) {
				t.Errorf("escape(%q) is not a prefix of escape(%q)", k[:i], k)
			}
		}
	}
	for _, bad := range []string{"%", "%7", "%zz", "{", "a}"} {
		if _, ok := unescapeKey(bad); ok {
			t.Errorf("unescapeKey(%q) accepted", bad)
		}
	}
	if _, ok := ks.keyOf("{p:x}:token"); ok {
		t.Error("keyOf accepted a counter name")
	}
	if _, ok := ks.keyOf("{q:x}:lock"); ok {
		t.Error("keyOf accepted another prefix")
	}
}

// globMatch is Redis's stringmatchlen for the subset List's patterns use
// (literal characters, backslash escapes, one trailing '*' before a
// literal suffix).
func globMatch(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if globMatch(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	case '\\':
		pattern = pattern[1:]
	case '?', '[':
		panic("unescaped glob metacharacter in pattern")
	}
	return s != "" && s[0] == pattern[0] && globMatch(pattern[1:], s[1:])
}

func TestPatternEscapesGlob(t *testing.T) {
	ks := keyspace{prefix: DefaultPrefix}
	for _, p := range oddKeys {
		pat := ks.pattern(p)
		for _, k := range oddKeys {
			want := strings.HasPrefix(k, p)
			if got := globMatch(pat, ks.lockName(k)); got != want {
				t.Errorf("pattern %q for prefix %q matches lock of %q: %v; want %v", pat, p, k, got, want)
			}
			_, counter, channel := ks.names(k)
			if globMatch(pat, counter) || globMatch(pat, channel) {
				t.Errorf("pattern %q matches a counter or channel of %q", pat, k)
			}
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"fencelock", "app:locks", "a/b.c_d-e", strings.Repeat("x", 128)} {
		if err := validatePrefix(p); err != nil {
			t.Errorf("validatePrefix(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "a{b", "a}b", "a*", "a?", "a[b]", `a\b`, "a b", "ключ", "a%b", strings.Repeat("x", 129)} {
		if err := validatePrefix(p); err == nil {
			t.Errorf("validatePrefix(%q) accepted", p)
		}
	}
}
