# shellcheck shell=bash
# testenv plugin: redisha, a Redis primary + one replica watched by one Redis
# Sentinel, on loopback, started only when named (`scripts/testenv up redisha`).
# Debian's redis-server binary runs all three (a Sentinel is `redis-server
# CONF --sentinel`; the redis-sentinel package adds only a service), with the
# settings of the redis plugin: AOF, `appendfsync always`.
#
# Members: 1 (the first primary), 2 (its replica), sentinel. Data in
# $TENV_DIR/ID/data, configs $TENV_DIR/ID/redis.conf and
# $TENV_DIR/sentinel/sentinel.conf (Redis and Sentinel rewrite them on
# failover). Master name "fencelock", quorum 1, down-after-milliseconds 1000,
# failover-timeout 5000: killing the primary makes the Sentinel promote the
# replica (REPLICAOF NO ONE) within a few seconds; a restarted old primary is
# turned into a replica of the new one. `member redisha failover` asks the
# Sentinel for a failover while both run (SENTINEL FAILOVER).
# Replication is asynchronous: a write acknowledged by the primary just before
# it dies may be missing on the promoted replica.
# URL: redis+sentinel://127.0.0.1:SENTINEL_PORT/fencelock/0

# shellcheck disable=SC2034 # read by scripts/testenv
redisha_members="1 2 sentinel"
REDISHA_MASTER=fencelock

redisha_packages() { redis_packages; }

redisha_install() {
	redis_install || return 1
	[[ -n $REDIS_CLI ]] || {
		echo "testenv: redisha: redis-cli not found (Debian package redis-tools)" >&2
		return 1
	}
}

# _rha_port ID: set _RHA_PORT to member ID's port.
_rha_port() {
	local var=REDISHA_PORT_$1
	_RHA_PORT=${!var}
}

# _rha_cli ID ARG...: run redis-cli against member ID (3 s at most).
_rha_cli() {
	_rha_port "$1"
	timeout 3 "$REDIS_CLI" -h 127.0.0.1 -p "$_RHA_PORT" "${@:2}" 2>/dev/null
}

redisha_init() {
	local id
	for id in $redisha_members; do
		tenv_save "REDISHA_PORT_$id" "$(tenv_free_port)"
		rm -rf "${TENV_DIR:?}/$id"
		mkdir -p "$TENV_DIR/$id/data"
	done
	for id in 1 2; do
		_rha_port "$id"
		cat >"$TENV_DIR/$id/redis.conf" <<CONF
# made by fencelock scripts/testenv (redisha, member $id)
port $_RHA_PORT
bind 127.0.0.1
protected-mode no
daemonize no
dir $TENV_DIR/$id/data
logfile ""
save ""
appendonly yes
appendfsync always
repl-diskless-sync yes
repl-diskless-sync-delay 0
CONF
	done
	_rha_port 1
	echo "replicaof 127.0.0.1 $_RHA_PORT" >>"$TENV_DIR/2/redis.conf"
	local master=$_RHA_PORT replica
	_rha_port 2
	replica=$_RHA_PORT
	_rha_port sentinel
	cat >"$TENV_DIR/sentinel/sentinel.conf" <<CONF
# made by fencelock scripts/testenv (redisha sentinel)
port $_RHA_PORT
bind 127.0.0.1
protected-mode no
daemonize no
dir $TENV_DIR/sentinel/data
logfile ""
sentinel monitor $REDISHA_MASTER 127.0.0.1 $master 1
sentinel down-after-milliseconds $REDISHA_MASTER 1000
sentinel failover-timeout $REDISHA_MASTER 5000
sentinel parallel-syncs $REDISHA_MASTER 1
# Known from the start: the Sentinel would learn of it from the primary's INFO
# only every 10 s.
sentinel known-replica $REDISHA_MASTER 127.0.0.1 $replica
CONF
}

redisha_start() {
	if [[ $TENV_MEMBER == sentinel ]]; then
		tenv_spawn "$REDIS_BIN" "$TENV_MDIR/sentinel.conf" --sentinel
	else
		tenv_spawn "$REDIS_BIN" "$TENV_MDIR/redis.conf"
	fi
}

redisha_member_ready() {
	local out
	out=$(_rha_cli "$TENV_MEMBER" ping)
	[[ $out == PONG ]]
}

# _rha_role ID: print member ID's role (master, slave).
_rha_role() {
	_rha_cli "$1" role | head -n 1
}

# _rha_sentinel_master: print the member ID the Sentinel names as primary.
_rha_sentinel_master() {
	local -a out
	local id
	mapfile -t out < <(_rha_cli sentinel sentinel get-master-addr-by-name "$REDISHA_MASTER")
	((${#out[@]} == 2)) || return 1
	for id in 1 2; do
		_rha_port "$id"
		if [[ ${out[1]} == "$_RHA_PORT" ]]; then
			echo "$id"
			return 0
		fi
	done
	return 1
}

# redisha_ready: the Sentinel names a primary that says so, and sees the
# replica up (flags "slave") with its link to the primary up, so that it can
# promote it.
redisha_ready() {
	local p r info i
	local -a kv
	p=$(_rha_sentinel_master) || return 1
	if [[ $p == 1 ]]; then r=2; else r=1; fi
	[[ $(_rha_role "$p") == master ]] || return 1
	info=$(_rha_cli "$r" info replication)
	[[ $info == *role:slave* && $info == *master_link_status:up* ]] || return 1
	mapfile -t kv < <(_rha_cli sentinel sentinel replicas "$REDISHA_MASTER")
	local flags="" link=""
	for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
		case ${kv[i]} in
		flags) flags=${kv[i + 1]} ;;
		master-link-status) link=${kv[i + 1]} ;;
		esac
	done
	[[ $flags == slave && $link == ok ]]
}

redisha_addr() {
	_rha_port "$TENV_MEMBER"
	echo "127.0.0.1:$_RHA_PORT"
}

redisha_url() {
	_rha_port sentinel
	echo "redis+sentinel://127.0.0.1:$_RHA_PORT/$REDISHA_MASTER/0"
}

# redisha_leader: the primary as the Sentinel names it (what clients of the URL
# use), if that member runs, is not paused and says it is a master.
redisha_leader() {
	local id
	id=$(_rha_sentinel_master) || return 1
	tenv_unit_active "$TENV_NAME/$id" || return 1
	[[ $(_rha_role "$id") == master ]] || return 1
	echo "$id"
}

# redisha_failover: SENTINEL FAILOVER, then wait until the other member is the
# primary and serves.
redisha_failover() {
	local old new out deadline=$((SECONDS + 30))
	old=$(redisha_leader) || {
		echo "testenv: redisha: no primary now, nothing to fail over" >&2
		return 1
	}
	out=$(_rha_cli sentinel sentinel failover "$REDISHA_MASTER")
	[[ $out == OK ]] || {
		echo "testenv: redisha: SENTINEL FAILOVER: $out" >&2
		return 1
	}
	while ((SECONDS < deadline)); do
		new=$(redisha_leader) && [[ $new != "$old" ]] && {
			echo "testenv: redisha: primary is now member $new (was $old)" >&2
			return 0
		}
		sleep 0.1
	done
	echo "testenv: redisha: no new primary after 30s" >&2
	return 1
}

redisha_version() {
	"$REDIS_BIN" --version
}
