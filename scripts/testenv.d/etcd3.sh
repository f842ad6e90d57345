# shellcheck shell=bash
# testenv plugin: etcd3, a 3-member etcd cluster on loopback, started only when
# named (`scripts/testenv up etcd3`). Each member is tools/etcd-test-server (the
# binary of the etcd plugin) with -initial-cluster naming all three peers.
#
# Members 1 2 3: client and peer ports on 127.0.0.1, data in $TENV_DIR/ID/data.
# Raft heartbeat 100 ms, election timeout 1000 ms (etcd's defaults), pre-vote on.
# URL: etcd://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3

# shellcheck disable=SC2034 # read by scripts/testenv
etcd3_members="1 2 3"

etcd3_packages() { :; }

etcd3_install() {
	local bin
	bin=$(tenv_go_build "$TENV_ROOT/tools/etcd-test-server" etcd-test-server) || return 1
	tenv_save ETCD_BIN "$bin"
}

etcd3_init() {
	local id cluster=""
	for id in $etcd3_members; do
		tenv_save "ETCD_CLIENT_PORT_$id" "$(tenv_free_port)"
		tenv_save "ETCD_PEER_PORT_$id" "$(tenv_free_port)"
		rm -rf "${TENV_DIR:?}/$id"
		mkdir -p "$TENV_DIR/$id"
	done
	for id in $etcd3_members; do
		_etcd3_port PEER "$id"
		cluster+=${cluster:+,}m$id=http://127.0.0.1:$_ETCD3_PORT
	done
	tenv_save ETCD_INITIAL_CLUSTER "$cluster"
}

# _etcd3_port CLIENT|PEER ID: set _ETCD3_PORT to member ID's port.
_etcd3_port() {
	local var=ETCD_${1}_PORT_$2
	_ETCD3_PORT=${!var}
}

etcd3_start() {
	local client peer
	_etcd3_port CLIENT "$TENV_MEMBER"
	client=$_ETCD3_PORT
	_etcd3_port PEER "$TENV_MEMBER"
	peer=$_ETCD3_PORT
	# -start-timeout 0: a member started while its peers are down waits for them.
	tenv_spawn "$ETCD_BIN" --data-dir "$TENV_MDIR/data" --name "m$TENV_MEMBER" \
		--client-port "$client" --peer-port "$peer" \
		--initial-cluster "$ETCD_INITIAL_CLUSTER" --initial-cluster-token "fencelock-etcd3" \
		--start-timeout 0
}

# _etcd3_health ID: member ID answers /health with true (it sees a leader).
_etcd3_health() {
	local out
	_etcd3_port CLIENT "$1"
	out=$(tenv_tcp "$_ETCD3_PORT" 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' all)
	[[ $out == *'"health":"true"'* ]]
}

etcd3_member_ready() { _etcd3_health "$TENV_MEMBER"; }

etcd3_ready() {
	local id
	for id in $etcd3_members; do _etcd3_health "$id" || return 1; done
}

etcd3_addr() {
	_etcd3_port CLIENT "$TENV_MEMBER"
	echo "127.0.0.1:$_ETCD3_PORT"
}

etcd3_url() {
	local id url=""
	for id in $etcd3_members; do
		_etcd3_port CLIENT "$id"
		url+=${url:+,}127.0.0.1:$_ETCD3_PORT
	done
	echo "etcd://$url"
}

# etcd3_leader: the member that reports itself as the raft leader
# (Maintenance.Status through etcd's JSON gateway). Paused and dead members are
# not asked.
etcd3_leader() {
	local id out self leader
	for id in $etcd3_members; do
		tenv_unit_active "$TENV_NAME/$id" || continue
		_etcd3_port CLIENT "$id"
		out=$(tenv_tcp "$_ETCD3_PORT" 'POST /v3/maintenance/status HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}' all) || continue
		[[ $out =~ \"member_id\":\"([0-9]+)\" ]] || continue
		self=${BASH_REMATCH[1]}
		[[ $out =~ \"leader\":\"([0-9]+)\" ]] || continue
		leader=${BASH_REMATCH[1]}
		if [[ $self == "$leader" ]]; then
			echo "$id"
			return 0
		fi
	done
	return 1
}

etcd3_version() {
	_etcd3_port CLIENT 1
	tenv_tcp "$_ETCD3_PORT" 'GET /version HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' all | tail -n 1
}
