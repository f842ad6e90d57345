# shellcheck shell=bash
# testenv plugin: Apache ZooKeeper 3.8 from Debian's `libzookeeper-java` (the jars
# of the `zookeeper` package, without its daemon scripts and full desktop JRE) and
# a headless JRE, run directly with java as a standalone server.
#
# tickTime=200 so sessions down to 400 ms are allowed; TTL nodes enabled
# (extendedTypesEnabled); admin server off; all four-letter words allowed.
# Log: $TENV_DIR/zookeeper.log. URL: zk://127.0.0.1:PORT

ZK_JAR=/usr/share/java/zookeeper.jar

_zk_java() {
	local j
	if command -v java >/dev/null 2>&1; then
		command -v java
		return 0
	fi
	for j in /usr/lib/jvm/*/bin/java; do
		[[ -x $j ]] && {
			echo "$j"
			return 0
		}
	done
	return 1
}

# _zk_classpath: our conf dir (log4j.properties), the server jar (its manifest
# lists the other jars), and Debian's slf4j->log4j 1.2 binding so it really logs.
_zk_classpath() {
	local cp=$TENV_DIR/conf:$ZK_JAR j
	for j in /usr/share/java/slf4j-log4j12.jar /usr/share/java/log4j-1.2.jar; do
		[[ -f $j ]] && cp+=:$j
	done
	echo "$cp"
}

zookeeper_packages() {
	[[ -f $ZK_JAR ]] || echo libzookeeper-java
	_zk_java >/dev/null || echo default-jre-headless
}

zookeeper_install() {
	local java
	java=$(_zk_java) || {
		echo "testenv: zookeeper: no java found" >&2
		return 1
	}
	[[ -f $ZK_JAR ]] || {
		echo "testenv: zookeeper: $ZK_JAR not found (Debian package libzookeeper-java)" >&2
		return 1
	}
	tenv_save ZK_JAVA "$java"
}

zookeeper_init() {
	local port
	port=$(tenv_free_port)
	tenv_save ZK_PORT "$port"
	rm -rf "$TENV_DIR/data" "$TENV_DIR/conf"
	mkdir -p "$TENV_DIR/data" "$TENV_DIR/conf"
	cat >"$TENV_DIR/conf/zoo.cfg" <<CONF
# made by fencelock scripts/testenv
tickTime=200
minSessionTimeout=400
maxSessionTimeout=60000
dataDir=$TENV_DIR/data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
extendedTypesEnabled=true
autopurge.purgeInterval=0
CONF
	cat >"$TENV_DIR/conf/log4j.properties" <<'CONF'
# made by fencelock scripts/testenv; stdout goes to the log file in the state dir
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
CONF
}

zookeeper_start() {
	tenv_spawn "$ZK_JAVA" -Xms32m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Djava.awt.headless=true \
		-Dlog4j.configuration="file:$TENV_DIR/conf/log4j.properties" \
		-Dzookeeper.admin.enableServer=false \
		-Dzookeeper.extendedTypesEnabled=true \
		-Dzookeeper.4lw.commands.whitelist='*' \
		-cp "$(_zk_classpath)" \
		org.apache.zookeeper.server.ZooKeeperServerMain "$TENV_DIR/conf/zoo.cfg"
}

zookeeper_ready() {
	local out
	out=$(tenv_tcp "$ZK_PORT" 'srvr' all)
	[[ $out == *"Mode: standalone"* ]]
}

zookeeper_url() {
	echo "zk://127.0.0.1:$ZK_PORT"
}

zookeeper_version() {
	tenv_tcp "$ZK_PORT" 'srvr' all | sed -n 's/^Zookeeper version: //p'
}
