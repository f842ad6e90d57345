package mysql

import "net/url"

// DSN is the go-sql-driver DSN that Open makes of u (credentials
// included), for tests that open a pool of their own.
func DSN(u *url.URL) string {
	cfg, _, _, err := parseURL(u)
	if err != nil {
		panic(err)
	}
	return cfg.FormatDSN()
}
