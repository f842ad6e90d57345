# shellcheck shell=bash
# testenv plugin: etcd v3.6, embedded (go.etcd.io/etcd/server/v3/embed) in
# tools/etcd-test-server, built once with the Go toolchain and cached.
#
# Single member, client and peer ports on 127.0.0.1, data in $TENV_DIR/data.
# URL: etcd://127.0.0.1:CLIENT_PORT

etcd_packages() { :; }

etcd_install() {
	local bin
	bin=$(tenv_go_build "$TENV_ROOT/tools/etcd-test-server" etcd-test-server) || return 1
	tenv_save ETCD_BIN "$bin"
}

etcd_init() {
	local client peer
	client=$(tenv_free_port)
	peer=$(tenv_free_port)
	tenv_save ETCD_CLIENT_PORT "$client"
	tenv_save ETCD_PEER_PORT "$peer"
	rm -rf "$TENV_DIR/data"
}

etcd_start() {
	tenv_spawn "$ETCD_BIN" --data-dir "$TENV_DIR/data" --name fencelock-test \
		--client-port "$ETCD_CLIENT_PORT" --peer-port "$ETCD_PEER_PORT"
}

etcd_ready() {
	local out
	out=$(tenv_tcp "$ETCD_CLIENT_PORT" 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' all)
	[[ $out == *'"health":"true"'* ]]
}

etcd_url() {
	echo "etcd://127.0.0.1:$ETCD_CLIENT_PORT"
}

etcd_version() {
	tenv_tcp "$ETCD_CLIENT_PORT" 'GET /version HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' all | tail -n 1
}
