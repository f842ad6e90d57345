# shellcheck shell=bash
# testenv plugin: Redis from Debian's `redis-server` package.
#
# Config in $TENV_DIR/redis.conf, data in $TENV_DIR/data. AOF persistence with
# `appendfsync always`, so an acknowledged write (e.g. a fencing-token INCR)
# survives `scripts/testenv restart redis` (kill -9).
# URL: redis://127.0.0.1:PORT/0

_redis_bin() {
	command -v redis-server 2>/dev/null || { [[ -x /usr/bin/redis-server ]] && echo /usr/bin/redis-server; }
}

redis_packages() {
	_redis_bin >/dev/null || echo redis-server
	command -v redis-cli >/dev/null 2>&1 || [[ -x /usr/bin/redis-cli ]] || echo redis-tools
}

redis_install() {
	local bin cli
	bin=$(_redis_bin) || {
		echo "testenv: redis: redis-server not found" >&2
		return 1
	}
	tenv_save REDIS_BIN "$bin"
	cli=$(command -v redis-cli 2>/dev/null || true)
	[[ -n $cli || ! -x /usr/bin/redis-cli ]] || cli=/usr/bin/redis-cli
	tenv_save REDIS_CLI "$cli"
}

redis_init() {
	local port
	port=$(tenv_free_port)
	tenv_save REDIS_PORT "$port"
	rm -rf "$TENV_DIR/data"
	mkdir -p "$TENV_DIR/data"
	cat >"$TENV_DIR/redis.conf" <<CONF
# made by fencelock scripts/testenv
port $port
bind 127.0.0.1
protected-mode no
daemonize no
dir $TENV_DIR/data
logfile ""
save ""
appendonly yes
appendfsync always
CONF
}

redis_start() {
	tenv_spawn "$REDIS_BIN" "$TENV_DIR/redis.conf"
}

redis_ready() {
	local out
	if [[ -n ${REDIS_CLI:-} ]]; then
		out=$(timeout 3 "$REDIS_CLI" -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)
	else
		out=$(tenv_tcp "$REDIS_PORT" 'PING\r\n' line)
	fi
	[[ ${out%$'\r'} == PONG || ${out%$'\r'} == +PONG ]]
}

redis_url() {
	echo "redis://127.0.0.1:$REDIS_PORT/0"
}

redis_version() {
	"$REDIS_BIN" --version
}
