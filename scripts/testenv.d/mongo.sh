# shellcheck shell=bash
# testenv plugin: MongoDB wire protocol, served by FerretDB v1.24.0 embedded in
# tools/ferretdb-test-server with its SQLite backend (real MongoDB is not
# installable here). Built once with the Go toolchain and cached.
#
# SQLite files in $TENV_DIR/data. URL: mongodb://127.0.0.1:PORT/

# OP_MSG {hello: 1, $db: "admin"}
_MONGO_HELLO='\x34\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\xdd\x07\x00\x00\x00\x00\x00\x00\x00\x1f\x00\x00\x00\x10\x68\x65\x6c\x6c\x6f\x00\x01\x00\x00\x00\x02\x24\x64\x62\x00\x06\x00\x00\x00\x61\x64\x6d\x69\x6e\x00\x00'

mongo_packages() { :; }

mongo_install() {
	local bin
	bin=$(tenv_go_build "$TENV_ROOT/tools/ferretdb-test-server" ferretdb-test-server \
		-tags ferretdb_no_postgresql) || return 1
	tenv_save MONGO_BIN "$bin"
}

mongo_init() {
	local port
	port=$(tenv_free_port)
	tenv_save MONGO_PORT "$port"
	rm -rf "$TENV_DIR/data"
	mkdir -p "$TENV_DIR/data"
}

mongo_start() {
	tenv_spawn "$MONGO_BIN" -data-dir "$TENV_DIR/data" -port "$MONGO_PORT"
}

mongo_ready() {
	local out
	# The reply is BSON; drop its NUL bytes so bash can hold it.
	out=$(tenv_tcp "$MONGO_PORT" "$_MONGO_HELLO" mongo | tr -d '\0')
	[[ $out == *maxWireVersion* ]]
}

mongo_url() {
	echo "mongodb://127.0.0.1:$MONGO_PORT/"
}

mongo_version() {
	echo "FerretDB v1.24.0 (embedded, SQLite backend)"
}
