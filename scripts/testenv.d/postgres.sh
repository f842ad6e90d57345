# shellcheck shell=bash
# testenv plugin: PostgreSQL from Debian's `postgresql` package.
#
# The server runs as an unprivileged user (PostgreSQL refuses root): the Debian
# `postgres` system user, created if missing. Data in $TENV_DIR/data, unix socket in
# $TENV_DIR/run, TCP on 127.0.0.1 only, trust auth, fsync at its default (on).
# Tests get superuser `fencelock` and database `fencelock`.
# URL: postgres://fencelock@127.0.0.1:PORT/fencelock?sslmode=disable

# shellcheck disable=SC2034 # read by scripts/testenv
postgres_stop_signal=INT # "fast" shutdown; TERM would wait for clients to leave

PG_TEST_USER=fencelock
PG_TEST_DB=fencelock

# _pg_bindir: newest /usr/lib/postgresql/N/bin with initdb+postgres, else PATH.
_pg_bindir() {
	local d best=""
	while read -r d; do
		[[ -x $d/initdb && -x $d/postgres && -x $d/pg_isready ]] && best=$d
	done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V)
	if [[ -z $best ]] && command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
		best=$(dirname "$(command -v postgres)")
	fi
	[[ -n $best ]] || return 1
	echo "$best"
}

postgres_packages() {
	_pg_bindir >/dev/null || echo postgresql
}

postgres_install() {
	local bindir user
	bindir=$(_pg_bindir) || {
		echo "testenv: postgres: no PostgreSQL server binaries (initdb, postgres) found" >&2
		return 1
	}
	tenv_save PG_BIN "$bindir"
	if ((EUID == 0)); then
		user=postgres
		if ! id -u "$user" >/dev/null 2>&1; then
			echo "testenv: postgres: creating system user $user" >&2
			useradd --system --user-group --home-dir /var/lib/postgresql --no-create-home \
				--shell /usr/sbin/nologin "$user"
		fi
	else
		user=$(id -un)
	fi
	tenv_save PG_USER "$user"
}

# _pg_as CMD...: fill PG_CMD with CMD run as $PG_USER (setpriv execs, so a PID stays the server's).
_pg_as() {
	if ((EUID == 0)); then
		PG_CMD=(setpriv --reuid="$PG_USER" --regid="$(id -g "$PG_USER")" --init-groups -- "$@")
	else
		PG_CMD=("$@")
	fi
}

postgres_init() {
	_pg_init_data
	cat >>"$TENV_DIR/data/postgresql.conf" <<CONF

# ---- fencelock scripts/testenv ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$TENV_DIR/run'
max_connections = 300
logging_collector = off
log_destination = 'stderr'
log_line_prefix = '%m [%p] '
CONF
}

# _pg_init_data: pick the port (saved as PG_PORT) and make the data dir with
# initdb's own postgresql.conf (the distribution's defaults), nothing appended.
# postgres-stock.sh uses it too.
_pg_init_data() {
	local port
	port=$(tenv_free_port)
	tenv_save PG_PORT "$port"
	rm -rf "$TENV_DIR/data" "$TENV_DIR/run"
	mkdir -p "$TENV_DIR/data" "$TENV_DIR/run"
	chmod 700 "$TENV_DIR/data"
	chmod 755 "$TENV_DIR"
	if ((EUID == 0)); then
		chown "$PG_USER:" "$TENV_DIR/data" "$TENV_DIR/run"
		# The state dir must be reachable for the postgres user.
		if ! setpriv --reuid="$PG_USER" --regid="$(id -g "$PG_USER")" --init-groups -- test -w "$TENV_DIR/data"; then
			echo "testenv: postgres: user $PG_USER cannot reach $TENV_DIR (is TMPDIR private?)" >&2
			return 1
		fi
	fi
	local -a initdb=("$PG_BIN/initdb" -D "$TENV_DIR/data" -U "$PG_TEST_USER" --auth=trust
		--no-locale --encoding=UTF8 --no-sync)
	# initdb takes seconds on a busy machine: keep a pristine copy of its result in
	# the cache, keyed by server version and initdb options, and copy that.
	local key template
	key=$({ "$PG_BIN/postgres" --version && printf '%s\n' "${initdb[@]:3}"; } | sha256sum | cut -c1-16)
	template=$TENV_CACHE/postgres-initdb-$key
	if [[ -f $template/PG_VERSION ]] && cp -a "$template/." "$TENV_DIR/data/" 2>/dev/null; then
		[[ $EUID -ne 0 ]] || chown -R "$PG_USER:" "$TENV_DIR/data"
		echo "initdb: copied from $template" >>"$TENV_LOG"
	else
		rm -rf "$TENV_DIR/data" && mkdir -p "$TENV_DIR/data" && chmod 700 "$TENV_DIR/data"
		[[ $EUID -ne 0 ]] || chown "$PG_USER:" "$TENV_DIR/data"
		_pg_as "${initdb[@]}"
		if ! (cd "$TENV_DIR" && "${PG_CMD[@]}") >>"$TENV_LOG" 2>&1; then
			echo "testenv: postgres: initdb failed (log: $TENV_LOG)" >&2
			return 1
		fi
		if mkdir -p "$TENV_CACHE" && cp -a "$TENV_DIR/data" "$template.tmp.$$" 2>/dev/null; then
			mv -T "$template.tmp.$$" "$template" 2>/dev/null || rm -rf "$template.tmp.$$"
		fi
	fi
}

postgres_start() {
	local lock lockpid state
	# After a kill -9 the old postmaster may still be an unreaped zombie, which
	# postgres takes for a live one: drop lock files whose PID is dead or a zombie.
	for lock in "$TENV_DIR/data/postmaster.pid" "$TENV_DIR"/run/.s.PGSQL.*.lock; do
		[[ -f $lock ]] || continue
		read -r lockpid <"$lock" || lockpid=
		state=
		if [[ $lockpid =~ ^[0-9]+$ ]] && tenv_stat "$lockpid"; then
			state=${TENV_STAT[0]}
		fi
		if [[ -z $state || $state == Z || $state == X ]]; then
			rm -f "$lock"
		fi
	done
	_pg_as "$PG_BIN/postgres" -D "$TENV_DIR/data"
	tenv_spawn "${PG_CMD[@]}"
}

postgres_ready() {
	"$PG_BIN/pg_isready" -q -t 2 -h 127.0.0.1 -p "$PG_PORT" -U "$PG_TEST_USER" -d postgres
}

postgres_setup() {
	local have
	have=$("$PG_BIN/psql" -X -h 127.0.0.1 -p "$PG_PORT" -U "$PG_TEST_USER" -d postgres -tAc \
		"SELECT 1 FROM pg_database WHERE datname = '$PG_TEST_DB'")
	if [[ $have != 1 ]]; then
		"$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U "$PG_TEST_USER" -d postgres \
			-c "CREATE DATABASE $PG_TEST_DB"
	fi
}

postgres_url() {
	echo "postgres://$PG_TEST_USER@127.0.0.1:$PG_PORT/$PG_TEST_DB?sslmode=disable"
}

postgres_version() {
	"$PG_BIN/postgres" --version
}
