package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
)

// TestRequireOnSingleServer checks the verdict on the test server, a
// single MariaDB with innodb_flush_log_at_trx_commit=1 and no replica:
// durable-tokens and server-clock are met (Open with them required
// succeeds), failover is not (Open refuses it, naming semi-synchronous
// replication).
func TestRequireOnSingleServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := testURL(t)
	url := withParams(t, base, "table", uniqueTable(t, base))
	c, err := fencelock.Open(ctx, withParams(t, url, "require", "durable-tokens,server-clock"), nil)
	if err != nil {
		t.Fatalf("Open with require=durable-tokens on a durable server: %v", err)
	}
	rs, err := driver.CheckGuarantees(ctx, c.Backend(), []fencelock.Guarantee{fencelock.DurableTokens})
	c.Close()
	if err != nil || !rs[0].Met || !strings.Contains(rs[0].Observed, "innodb_flush_log_at_trx_commit=1") {
		t.Errorf("durable-tokens = %+v, %v; want met, observed innodb_flush_log_at_trx_commit=1", rs, err)
	}
	c, err = fencelock.Open(ctx, withParams(t, url, "require", "failover"), nil)
	if err == nil {
		c.Close()
		t.Fatal("Open with require=failover succeeded on a single server")
	}
	var ue *driver.UnmetGuaranteeError
	if !errors.As(err, &ue) || len(ue.Unmet) != 1 || ue.Unmet[0].Guarantee != fencelock.Failover {
		t.Fatalf("err = %v; want *UnmetGuaranteeError for failover alone", err)
	}
	if r := ue.Unmet[0]; !strings.Contains(r.Observed, "no replica") || !strings.Contains(r.Fix, "AFTER_SYNC") {
		t.Errorf("failover unmet: %+v; want no replica observed and semi-synchronous AFTER_SYNC as the fix", r)
	}
}

// A lock table that is not InnoDB (MyISAM: no row locks, no transactions,
// so two owners could hold a key) is refused by Open with an
// *InvalidOptionError naming the ALTER TABLE that fixes it.
func TestNonInnoDBTableRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := testURL(t)
	table := uniqueTable(t, base)
	db := rawDB(t, base)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+table+"` (lock_key VARBINARY(512) NOT NULL PRIMARY KEY, owner VARBINARY(512) NOT NULL, token BIGINT UNSIGNED NOT NULL, locked_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL, version BIGINT UNSIGNED NOT NULL DEFAULT 0, metadata VARBINARY(4096), metadata_owner VARBINARY(512)) ENGINE = MyISAM"); err != nil {
		t.Fatal(err)
	}
	b, err := mysql.Open(ctx, withParams(t, base, "table", table))
	if err == nil {
		b.Close()
		t.Fatal("Open on a MyISAM lock table succeeded")
	}
	var ie *driver.InvalidOptionError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "MyISAM") || !strings.Contains(err.Error(), "ENGINE = InnoDB") {
		t.Errorf("Open on a MyISAM table: %v; want *driver.InvalidOptionError naming MyISAM and ALTER TABLE … ENGINE = InnoDB", err)
	}
}

// On a server whose innodb_flush_log_at_trx_commit is not 1 (a crash can
// lose acknowledged commits), Describe warns and durable-tokens is not
// met, naming the setting; a server of the test's own, since the setting
// is global.
func TestFlushLogSettingReported(t *testing.T) {
	_, u := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := rawDB(t, u)
	defer db.Close()
	if _, err := db.ExecContext(ctx, "SET GLOBAL innodb_flush_log_at_trx_commit = 2"); err != nil {
		t.Fatal(err)
	}
	b, err := mysql.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	d := b.Describe()
	if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "innodb_flush_log_at_trx_commit=2") {
		t.Errorf("Describe().Warnings = %q; want one naming innodb_flush_log_at_trx_commit=2", d.Warnings)
	}
	m, err := b.Guarantees(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if dt := m[driver.DurableTokens]; dt.Met || !strings.Contains(dt.Observed, "innodb_flush_log_at_trx_commit=2") || !strings.Contains(dt.Fix, "innodb_flush_log_at_trx_commit = 1") {
		t.Errorf("durable-tokens = %+v; want unmet, observing the setting, and the fix", dt)
	}
}
