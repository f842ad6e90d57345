# shellcheck shell=bash
# testenv plugin: zookeeper3, a 3-node ZooKeeper ensemble on loopback, started
# only when named (`scripts/testenv up zookeeper3`). Same install as the
# zookeeper plugin (Debian libzookeeper-java + a headless JRE; its helpers
# _zk_java and _zk_classpath), each node run with java as a QuorumPeerMain.
#
# Nodes 1 2 3: client, quorum and election ports on 127.0.0.1, data (and myid)
# in $TENV_DIR/ID/data, config $TENV_DIR/ID/zoo.cfg; JVM heap at most 256 MiB.
# tickTime=200 (sessions of 400 ms to 60 s), syncLimit=5 ticks, so followers
# notice a dead leader within about a second; election notifications retried
# at most every second (not 60 s), so nodes that start at different times on a
# busy machine find each other quickly; TTL nodes on; admin server off.
# URL: zk://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3

# shellcheck disable=SC2034 # read by scripts/testenv
zookeeper3_members="1 2 3"

zookeeper3_packages() { zookeeper_packages; }

zookeeper3_install() { zookeeper_install; }

# _zk3_port CLIENT|QUORUM|ELECTION ID: set _ZK3_PORT to node ID's port.
_zk3_port() {
	local var=ZK_${1}_PORT_$2
	_ZK3_PORT=${!var}
}

zookeeper3_init() {
	local id servers=""
	for id in $zookeeper3_members; do
		tenv_save "ZK_CLIENT_PORT_$id" "$(tenv_free_port)"
		tenv_save "ZK_QUORUM_PORT_$id" "$(tenv_free_port)"
		tenv_save "ZK_ELECTION_PORT_$id" "$(tenv_free_port)"
	done
	for id in $zookeeper3_members; do
		_zk3_port QUORUM "$id"
		servers+="server.$id=127.0.0.1:$_ZK3_PORT"
		_zk3_port ELECTION "$id"
		servers+=":$_ZK3_PORT"$'\n'
	done
	rm -rf "$TENV_DIR/conf"
	mkdir -p "$TENV_DIR/conf"
	for id in $zookeeper3_members; do
		rm -rf "${TENV_DIR:?}/$id"
		mkdir -p "$TENV_DIR/$id/data"
		echo "$id" >"$TENV_DIR/$id/data/myid"
		_zk3_port CLIENT "$id"
		cat >"$TENV_DIR/$id/zoo.cfg" <<CONF
# made by fencelock scripts/testenv (zookeeper3, node $id)
tickTime=200
initLimit=50
syncLimit=5
minSessionTimeout=400
maxSessionTimeout=60000
dataDir=$TENV_DIR/$id/data
clientPort=$_ZK3_PORT
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
extendedTypesEnabled=true
autopurge.purgeInterval=0
reconfigEnabled=false
standaloneEnabled=false
cnxTimeout=1000
$servers
CONF
	done
	cat >"$TENV_DIR/conf/log4j.properties" <<'CONF'
# made by fencelock scripts/testenv; stdout goes to each node's log file
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
CONF
}

zookeeper3_start() {
	# _zk_classpath puts $TENV_DIR/conf (log4j.properties) first.
	tenv_spawn "$ZK_JAVA" -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-XX:-UsePerfData -Djava.awt.headless=true \
		-Dlog4j.configuration="file:$TENV_DIR/conf/log4j.properties" \
		-Dzookeeper.admin.enableServer=false \
		-Dzookeeper.extendedTypesEnabled=true \
		-Dzookeeper.4lw.commands.whitelist='*' \
		-Dzookeeper.fastleader.maxNotificationInterval=1000 \
		-cp "$(_zk_classpath)" \
		org.apache.zookeeper.server.quorum.QuorumPeerMain "$TENV_MDIR/zoo.cfg"
}

# _zk3_mode ID: print node ID's mode (leader, follower), if it serves.
_zk3_mode() {
	_zk3_port CLIENT "$1"
	tenv_tcp "$_ZK3_PORT" 'srvr' all | sed -n 's/^Mode: //p'
}

zookeeper3_member_ready() {
	local mode
	mode=$(_zk3_mode "$TENV_MEMBER")
	[[ $mode == leader || $mode == follower ]]
}

zookeeper3_ready() {
	local id mode leaders=0
	for id in $zookeeper3_members; do
		mode=$(_zk3_mode "$id")
		case $mode in
		leader) leaders=$((leaders + 1)) ;;
		follower) ;;
		*) return 1 ;;
		esac
	done
	((leaders == 1))
}

zookeeper3_addr() {
	_zk3_port CLIENT "$TENV_MEMBER"
	echo "127.0.0.1:$_ZK3_PORT"
}

zookeeper3_url() {
	local id url=""
	for id in $zookeeper3_members; do
		_zk3_port CLIENT "$id"
		url+=${url:+,}127.0.0.1:$_ZK3_PORT
	done
	echo "zk://$url"
}

# zookeeper3_leader: the node whose `srvr` says "Mode: leader". Paused and dead
# nodes are not asked.
zookeeper3_leader() {
	local id
	for id in $zookeeper3_members; do
		tenv_unit_active "$TENV_NAME/$id" || continue
		if [[ $(_zk3_mode "$id") == leader ]]; then
			echo "$id"
			return 0
		fi
	done
	return 1
}

zookeeper3_version() {
	_zk3_port CLIENT 1
	tenv_tcp "$_ZK3_PORT" 'srvr' all | sed -n 's/^Zookeeper version: //p'
}
