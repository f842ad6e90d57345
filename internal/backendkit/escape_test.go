package backendkit

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// The three codecs the backends had before this package, verbatim. The
// encodings they wrote are stored in etcd, Redis and ZooKeeper: the shared
// codec must produce them byte for byte.

func oldEtcdEscape(s string) string {
	const hexDigits = "0123456789ABCDEF"
	n := strings.Count(s, "%") + strings.Count(s, "/")
	if n == 0 {
		return s
	}
	var sb strings.Builder
	sb.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || c == '/' {
			sb.WriteByte('%')
			sb.WriteByte(hexDigits[c>>4])
			sb.WriteByte(hexDigits[c&15])
			continue
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

func oldEtcdUnhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func oldEtcdUnescape(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, !strings.Contains(s, "/")
	}
	var sb strings.Builder
	sb.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '/':
			return "", false
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			hi, ok1 := oldEtcdUnhex(s[i+1])
			lo, ok2 := oldEtcdUnhex(s[i+2])
			if !ok1 || !ok2 {
				return "", false
			}
			sb.WriteByte(hi<<4 | lo)
			i += 2
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String(), true
}

func oldRedisEscape(k string) string {
	if !strings.ContainsAny(k, "%{}") {
		return k
	}
	var sb strings.Builder
	sb.Grow(len(k) + 8)
	for i := 0; i < len(k); i++ {
		switch c := k[i]; c {
		case '%':
			sb.WriteString("%25")
		case '{':
			sb.WriteString("%7B")
		case '}':
			sb.WriteString("%7D")
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

func oldRedisUnescape(e string) (string, bool) {
	if !strings.Contains(e, "%") {
		return e, !strings.ContainsAny(e, "{}")
	}
	var sb strings.Builder
	sb.Grow(len(e))
	for i := 0; i < len(e); i++ {
		c := e[i]
		switch c {
		case '{', '}':
			return "", false
		case '%':
			if i+2 >= len(e) {
				return "", false
			}
			switch e[i+1 : i+3] {
			case "25":
				sb.WriteByte('%')
			case "7B":
				sb.WriteByte('{')
			case "7D":
				sb.WriteByte('}')
			default:
				return "", false
			}
			i += 2
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String(), true
}

func oldZKSafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// The ZooKeeper codec without its one reserved name ("zookeeper"), which
// stays in backend/zookeeper.
func oldZKEscape(key string) string {
	var sb strings.Builder
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if oldZKSafe(c) {
			sb.WriteByte(c)
			continue
		}
		sb.WriteByte('%')
		sb.WriteByte(hex[c>>4])
		sb.WriteByte(hex[c&15])
	}
	return sb.String()
}

func oldZKUnescape(name string) (string, bool) {
	var sb strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c != '%' {
			if !oldZKSafe(c) {
				return "", false
			}
			sb.WriteByte(c)
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		h := name[i+1 : i+3]
		if strings.ToUpper(h) != h {
			return "", false
		}
		v, err := strconv.ParseUint(h, 16, 8)
		if err != nil || oldZKSafe(byte(v)) {
			return "", false
		}
		sb.WriteByte(byte(v))
		i += 2
	}
	return sb.String(), true
}

type legacy struct {
	name     string
	codec    *Codec
	escape   func(string) string
	unescape func(string) (string, bool)
	// lenient: the old decoder also accepted non-canonical escapes
	// (lower-case hex, escapes of unreserved bytes), which the shared codec
	// rejects; every name the old encoder produced decodes the same.
	lenient bool
}

func legacies() []legacy {
	return []legacy{
		{"etcd", NewCodec("/"), oldEtcdEscape, oldEtcdUnescape, true},
		{"redis", NewCodec("{}"), oldRedisEscape, oldRedisUnescape, false},
		{"zookeeper", NewCodecFunc(func(c byte) bool { return !oldZKSafe(c) }), oldZKEscape, oldZKUnescape, false},
	}
}

// corpus returns every string of up to two bytes, a set of typical keys
// and random strings biased towards the bytes the codecs care about.
func corpus() []string {
	out := []string{"", "orders/42", "a%b", "{tag}", "%25", "%7B", "%2F", "%2f", "%41", "%", "%2", "zookeeper",
		"ünïcødé/ключ", "a b\tc\n", "..", ".", "/", "//", "%%%", "x%zz", "%7a", "_-"}
	for i := range 256 {
		out = append(out, string([]byte{byte(i)}))
		for _, j := range []byte{'%', '/', '{', '}', 'A', '2', '5', 'F', 'f', 0, 0xff} {
			out = append(out, string([]byte{byte(i), j}), string([]byte{j, byte(i)}))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("%/{}aAzZ09_-.:2578BDFbdf \x00\xff\xc3")
	for range 20000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			if r.IntN(4) == 0 {
				b[i] = byte(r.IntN(256))
			} else {
				b[i] = alphabet[r.IntN(len(alphabet))]
			}
		}
		out = append(out, string(b))
	}
	return out
}

// TestCodecMatchesLegacyEncodings: for every backend, the shared codec
// writes exactly the bytes the backend's own codec wrote, reads back every
// name that codec wrote, and agrees with the old decoder on every other
// input except the non-canonical names a lenient old decoder accepted.
func TestCodecMatchesLegacyEncodings(t *testing.T) {
	in := corpus()
	for _, l := range legacies() {
		t.Run(l.name, func(t *testing.T) {
			for _, s := range in {
				got, want := l.codec.Escape(s), l.escape(s)
				if got != want {
					t.Fatalf("Escape(%q) = %q, the old %s codec wrote %q", s, got, l.name, want)
				}
				if back, ok := l.codec.Unescape(got); !ok || back != s {
					t.Fatalf("Unescape(Escape(%q)) = %q, %v", s, back, ok)
				}
				nv, nok := l.codec.Unescape(s)
				ov, ook := l.unescape(s)
				switch {
				case nok && (!ook || nv != ov):
					t.Fatalf("Unescape(%q) = %q, %v; the old decoder said %q, %v", s, nv, nok, ov, ook)
				case !nok && ook && !l.lenient:
					t.Fatalf("Unescape(%q) rejects what the old decoder read as %q", s, ov)
				case !nok && ook && l.codec.Escape(ov) == s:
					t.Fatalf("Unescape(%q) rejects a name the old encoder writes (for %q)", s, ov)
				}
			}
		})
	}
}

// TestCodecPrefixOrder: the escape of a prefix is a prefix of the escape
// of every string that starts with it, and only of those.
func TestCodecPrefixOrder(t *testing.T) {
	c := NewCodec("/")
	in := corpus()[:3000]
	for _, p := range in[:300] {
		for _, s := range in {
			if strings.HasPrefix(c.Escape(s), c.Escape(p)) != strings.HasPrefix(s, p) {
				t.Fatalf("prefix order broken for %q, %q", p, s)
			}
		}
	}
}

func FuzzCodec(f *testing.F) {
	for _, s := range []string{"", "a/b", "%", "{x}", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, l := range legacies() {
			if got, want := l.codec.Escape(s), l.escape(s); got != want {
				t.Fatalf("%s: Escape(%q) = %q, want %q", l.name, s, got, want)
			}
			if v, ok := l.codec.Unescape(s); ok && l.codec.Escape(v) != s {
				t.Fatalf("%s: Unescape accepted the non-canonical %q", l.name, s)
			}
		}
	})
}
