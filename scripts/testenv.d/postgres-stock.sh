# shellcheck shell=bash
# testenv plugin: PostgreSQL in its stock configuration, for the conformance
# pass that proves what a third party with a packaged server sees.
#
# The same server binaries, user and initdb as postgres.sh, but postgresql.conf
# is exactly what initdb wrote (the distribution's defaults: max_connections
# 100, fsync on, synchronous_commit on, no statement or idle timeouts) apart
# from where it listens: 127.0.0.1, its own port and socket dir.
# URL: postgres://fencelock@127.0.0.1:PORT/fencelock?sslmode=disable

# shellcheck disable=SC2034 # read by scripts/testenv (a - in the name is _ here)
postgres_stock_stop_signal=INT

postgres-stock_packages() { postgres_packages; }
postgres-stock_install() { postgres_install; }

postgres-stock_init() {
	_pg_init_data
	cat >>"$TENV_DIR/data/postgresql.conf" <<CONF

# ---- fencelock scripts/testenv (stock: only where it listens) ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$TENV_DIR/run'
CONF
}

postgres-stock_start() { postgres_start; }
postgres-stock_ready() { postgres_ready; }
postgres-stock_setup() { postgres_setup; }
postgres-stock_url() { postgres_url; }
postgres-stock_version() { postgres_version; }
