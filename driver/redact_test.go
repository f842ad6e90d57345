package driver_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fencelock/fencelock/driver"
)

const pw = "Hunter2pw"

func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://app:" + pw + "@db:5432/app", "postgres://app:xxxxx@db:5432/app"},
		{"postgres://app@127.0.0.1:1/db?password=" + pw, "postgres://app@127.0.0.1:1/db?password=xxxxx"},
		{"postgres://h/db?sslmode=require&sslpassword=" + pw + "&sslkey=/k/" + pw, "postgres://h/db?sslmode=require&sslpassword=xxxxx&sslkey=xxxxx"},
		{"redis+sentinel://h1,h2/m?sentinel_password=A" + pw + "&sentinel_password=B" + pw, "redis+sentinel://h1,h2/m?sentinel_password=xxxxx&sentinel_password=xxxxx"},
		{"foo://h/x?password=" + pw, "foo://h/x?password=xxxxx"},
		{"mongodb://u:" + pw + "@h/db?authMechanismProperties=AWS_SESSION_TOKEN:" + pw + ";tlsCertificateKeyFilePassword=" + pw, "mongodb://u:xxxxx@h/db?authMechanismProperties=xxxxx;tlsCertificateKeyFilePassword=xxxxx"},
		{"etcds://u:" + pw + "@h:2379/p/?key_file=/x/" + pw, "etcds://u:xxxxx@h:2379/p/?key_file=xxxxx"},
		{"zk://h:2181/c?auth=digest:u:" + pw, "zk://h:2181/c?auth=xxxxx"},
		{"redis://h:6379/0?prefix=p&owner=job@host1", "redis://h:6379/0?prefix=p&owner=job@host1"},
		{"redis://h:6379/0", "redis://h:6379/0"},
		{"file:///tmp/x", "file:///tmp/x"},
		{"mem://X?x=1", "mem://X?x=1"},
		{"redis://:" + pw + "@h", "redis://:xxxxx@h"},
		// Malformed: url.Parse rejects these.
		{"postgres://app:" + pw + "%zz@h/db", "postgres://app:xxxxx@h/db"},
		{"postgres://app:pa/" + pw + "@h/db", "postgres://app:xxxxx@h/db"},
		{"postgres://app:12?" + pw + "@h/db", "postgres://app:xxxxx@h/db"},
		{"postgres://app:" + pw + "@h:99999 /db?password=" + pw, "postgres://app:xxxxx@h:99999 /db?password=xxxxx"},
		{"host=h user=u password=" + pw + " dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"h:5432 password=" + pw, "h:5432 password=xxxxx"},
		// No scheme: "user:password@host" parses as scheme "user".
		{"app:" + pw + "@db:5432/app", "app:xxxxx@db:5432/app"},
		{"app:" + pw + "@db", "app:xxxxx@db"},
		{"app:" + pw + "@db:5432/app?sslmode=disable&password=" + pw, "app:xxxxx@db:5432/app?sslmode=disable&password=xxxxx"},
		// Nested, escaped and not.
		{"dual://?old=" + url.QueryEscape("postgres://u:"+pw+"@h/db") + "&new=" + url.QueryEscape("redis://h?password="+pw),
			"dual://?old=" + url.QueryEscape("postgres://u:xxxxx@h/db") + "&new=" + url.QueryEscape("redis://h?password=xxxxx")},
		{"postgres://h/db?listen_url=" + url.QueryEscape("postgres://u:"+pw+"@h2/db"), "postgres://h/db?listen_url=" + url.QueryEscape("postgres://u:xxxxx@h2/db")},
	} {
		got := driver.RedactURL(c.in)
		if got != c.want {
			t.Errorf("RedactURL(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
		if strings.Contains(got, pw) {
			t.Errorf("RedactURL(%q) = %q: secret shown", c.in, got)
		}
	}
}

func TestRedactTextAndError(t *testing.T) {
	raw := "postgres://app:" + url.QueryEscape("p@ss "+pw) + "@h/db?password=" + pw + "x&sslpassword=" + url.QueryEscape(pw+"/y")
	msg := "cannot parse `" + raw + "`: bad; password p@ss " + pw + " or " + pw + "x or " + url.PathEscape(pw+"/y") + " or " + pw + "/y"
	got := driver.RedactText(msg, raw)
	if strings.Contains(got, pw) {
		t.Fatalf("RedactText left a secret: %q", got)
	}
	err := driver.RedactError(context.DeadlineExceeded, "redis://:"+pw+"@h")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RedactError lost errors.Is: %v", err)
	}
	err = driver.RedactError(errors.New("dial redis://:"+pw+"@h: refused"), "redis://:"+pw+"@h")
	if strings.Contains(err.Error(), pw) {
		t.Fatalf("RedactError left a secret: %q", err)
	}
	if driver.RedactError(nil, "x") != nil {
		t.Fatal("RedactError(nil) is not nil")
	}
}

// plantings are the positions FuzzRedactURL puts a secret in: %s is the
// fuzzed text around it, %p the secret.
var plantings = []func(text, secret string) string{
	func(x, s string) string { return "postgres://u:" + url.PathEscape(s) + "@" + x },
	func(x, s string) string { return "redis://" + x + "?password=" + url.QueryEscape(s) },
	func(x, s string) string { return "redis://u:" + s + "@" + x },
	func(x, s string) string { return x + "?a=1&sentinel_password=" + s + "&sentinel_password=" + s },
	func(x, s string) string { return "mongodb://" + x + "/?authMechanismProperties=TOKEN:" + s + ";w=1" },
	func(x, s string) string { return x + " password=" + s },
	func(x, s string) string {
		return "dual://?old=" + url.QueryEscape("zk://"+x+"?x_token="+url.QueryEscape(s)) + "&new=" + url.QueryEscape("etcd://u:"+url.PathEscape(s)+"@"+x)
	},
	func(x, s string) string { return "foo://" + x + "/?SECRET=" + s + "#frag" },
}

// FuzzRedactURL checks that for any text and any secret planted in a
// credential position, RedactURL's output does not contain the secret.
// Secrets planted unescaped keep to the characters a URL allows there;
// escaped ones may be anything.
func FuzzRedactURL(f *testing.F) {
	for i := range plantings {
		f.Add(uint8(i), "h:6379/0", pw)
		f.Add(uint8(i), "app@h1:5432,h2:5432/db?sslmode=disable", "p@ss:w/rd?#")
		f.Add(uint8(i), "h:99999%zz", "s3cr3t")
		f.Add(uint8(i), "", "\x00\xffpw")
	}
	f.Fuzz(func(t *testing.T, which uint8, text, secret string) {
		plant := plantings[int(which)%len(plantings)]
		if len(secret) < 4 || strings.Contains(text, "://") {
			t.Skip()
		}
		unescaped := int(which)%len(plantings) != 0 && int(which)%len(plantings) != 1 && int(which)%len(plantings) != 6
		if unescaped && (!utf8.ValidString(secret) || strings.ContainsAny(secret, "?#@/&;=%+ \t\r\n\\\"") || strings.ContainsAny(text, "@?#")) {
			t.Skip()
		}
		raw := plant(text, secret)
		got := driver.RedactURL(raw)
		// The secret may legitimately appear where the fuzzer put it in
		// the surrounding text too: check that it is not in the output
		// more often than in the redacted surroundings.
		around := driver.RedactURL(plant(text, "\x01\x02\x03\x04"))
		if strings.Contains(around, secret) || strings.Contains(around, url.QueryEscape(secret)) || strings.Contains(strings.ReplaceAll(raw, secret, ""), secret) {
			t.Skip()
		}
		if strings.Contains(got, secret) || strings.Contains(got, url.QueryEscape(secret)) {
			t.Fatalf("RedactURL(%q) = %q: secret %q shown", raw, got, secret)
		}
		if strings.ContainsAny(text, "@?#&;= \t\r\n%") || int(which)%len(plantings) == 4 {
			return // the planted secret may be only part of the URL's
		}
		if txt := driver.RedactText("error: "+raw+" secret "+secret, raw); strings.Contains(txt, secret) {
			t.Fatalf("RedactText(..., %q) = %q: secret %q shown", raw, txt, secret)
		}
	})
}

func TestParamsNeverShowSecretValues(t *testing.T) {
	u, _ := url.Parse("redis+sentinel://h/m?sentinel_password=A" + pw + "&sentinel_password=B" + pw + "&token_ttl=" + pw)
	p := driver.NewParams(u)
	p.String("sentinel_password", "")
	err := p.Err()
	if err == nil || !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("repeated parameter: err = %v, want ErrInvalidOption", err)
	}
	if strings.Contains(err.Error(), pw) {
		t.Fatalf("repeated parameter error shows the secret: %v", err)
	}
	p = driver.NewParams(u)
	p.Duration("token_ttl", 0)
	if err := p.Err(); err == nil || strings.Contains(err.Error(), pw) {
		t.Fatalf("malformed secret parameter: err = %v", err)
	}
}

func TestParamsNoKnownParameters(t *testing.T) {
	u, _ := url.Parse("mem://X?x=1")
	err := driver.NewParams(u).Err()
	if err == nil || !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("err = %v, want ErrInvalidOption", err)
	}
	if strings.HasSuffix(err.Error(), ": ") || !strings.Contains(err.Error(), "no parameters") {
		t.Fatalf("err = %q: want it to say the URL takes no parameters", err)
	}
}

// TestUnknownParamNamesTheLikelyOne checks that a misspelt URL parameter
// gets the backend's and the engine's parameters listed, and the one it
// probably meant named.
func TestUnknownParamNamesTheLikelyOne(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"x://h?tll=5s&table=t", "did you mean ttl?"},
		{"x://h?tabel=t", "did you mean table?"},
		{"x://h?renew_intervall=1s", "did you mean renew_interval?"},
	} {
		u, _ := url.Parse(c.url)
		p := driver.NewParams(u)
		p.String("table", "")
		err := p.Err()
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) ||
			!strings.Contains(err.Error(), "table") || !strings.Contains(err.Error(), "ttl") {
			t.Errorf("%s: err = %v; want it to list table and ttl and say %q", c.url, err, c.want)
		}
	}
}

// TestUnknownCredentialParamSaysWhereItGoes checks that a password or
// user given as a query parameter, to a backend that takes none, is told
// the userinfo is its place, without showing the value.
func TestUnknownCredentialParamSaysWhereItGoes(t *testing.T) {
	u, _ := url.Parse("x://h?password=" + pw)
	p := driver.NewParams(u)
	p.String("table", "")
	err := p.Err()
	if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "USER:PASSWORD@HOST") || strings.Contains(err.Error(), pw) {
		t.Errorf("err = %v; want the userinfo named as the place for credentials, and no secret", err)
	}
}
