# shellcheck shell=bash
# testenv plugin: Redis in its stock configuration, for the conformance pass
# that proves what a third party with a packaged server sees.
#
# The same redis-server as redis.sh. Its config includes the packaged
# /etc/redis/redis.conf when that is readable (else redis-server's built-in
# defaults, which it mirrors): RDB snapshots, no AOF, no timeouts or limits
# tuned. Only what a second server on the machine must change is overridden:
# port, bind 127.0.0.1, dir, pid file, no daemonizing, log to stdout.
# URL: redis://127.0.0.1:PORT/0

redis-stock_packages() { redis_packages; }
redis-stock_install() { redis_install; }

redis-stock_init() {
	local port include=
	port=$(tenv_free_port)
	tenv_save REDIS_PORT "$port"
	rm -rf "$TENV_DIR/data"
	mkdir -p "$TENV_DIR/data"
	if [[ -r /etc/redis/redis.conf ]]; then include="include /etc/redis/redis.conf"; fi
	cat >"$TENV_DIR/redis.conf" <<CONF
# made by fencelock scripts/testenv: the packaged defaults, except where it listens
$include
port $port
bind 127.0.0.1
daemonize no
supervised no
pidfile $TENV_DIR/redis.pid
logfile ""
dir $TENV_DIR/data
CONF
}

redis-stock_start() { redis_start; }
redis-stock_ready() { redis_ready; }
redis-stock_url() { redis_url; }
redis-stock_version() { redis_version; }
