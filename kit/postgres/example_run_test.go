package pgfence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestExample runs Example in a schema of its own (search_path), so the
// example can use the default table names, and checks what it wrote: the
// credit and its fence.
func TestExample(t *testing.T) {
	ctx := ctxT(t)
	base := testURL(t)
	schema := "fencelock_kit_example_" + randHex()
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p, err := pgxpool.New(ctx, base)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer p.Close()
		if _, err := p.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	t.Setenv("FENCELOCK_TEST_POSTGRES", base+sep+"search_path="+schema)
	Example()

	var balance, token int64
	var holder string
	if err := pool.QueryRow(ctx, `SELECT balance FROM `+pgx.Identifier{schema, "accounts"}.Sanitize()+` WHERE id = 1`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT token, holder FROM `+pgx.Identifier{schema, "fencelock_fences"}.Sanitize()+` WHERE resource = 'accounts/1'`).Scan(&token, &holder); err != nil {
		t.Fatal(err)
	}
	if balance != 100 || token < 1 || holder == "" {
		t.Errorf("after Example: balance %d, fence %d %q; want 100 and a recorded token and holder", balance, token, holder)
	}
}
