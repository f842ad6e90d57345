# shellcheck shell=bash
# testenv plugin: Apache ZooKeeper in its distribution's default configuration,
# for the conformance pass that proves what a third party with a stock server
# sees.
#
# The same jars and JRE as zookeeper.sh, run standalone with the settings of
# the distribution's sample zoo.cfg (conf/zoo_sample.cfg, which Debian ships as
# /etc/zookeeper/conf_example/zoo.cfg): tickTime=2000, initLimit=10,
# syncLimit=5, so the server negotiates session timeouts of 4 s to 40 s
# (2..20 × tickTime). Everything else is at ZooKeeper's built-in defaults
# (maxClientCnxns 60 per client address, four-letter words: srvr only, no TTL
# nodes) except where it listens: its own port on 127.0.0.1, its own dataDir,
# and the admin server off (it would take port 8080).
# Log: $TENV_DIR/zookeeper-stock.log. URL: zk://127.0.0.1:PORT

zookeeper-stock_packages() { zookeeper_packages; }
zookeeper-stock_install() { zookeeper_install; }

zookeeper-stock_init() {
	local port
	port=$(tenv_free_port)
	tenv_save ZK_PORT "$port"
	rm -rf "$TENV_DIR/data" "$TENV_DIR/conf"
	mkdir -p "$TENV_DIR/data" "$TENV_DIR/conf"
	cat >"$TENV_DIR/conf/zoo.cfg" <<CONF
# made by fencelock scripts/testenv: the distribution's zoo_sample.cfg, except
# where it listens (clientPort, clientPortAddress, dataDir, admin server off)
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$TENV_DIR/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
CONF
	cat >"$TENV_DIR/conf/log4j.properties" <<'CONF'
# made by fencelock scripts/testenv; stdout goes to the log file in the state dir
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
CONF
}

zookeeper-stock_start() {
	tenv_spawn "$ZK_JAVA" -Xms32m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Djava.awt.headless=true \
		-Dlog4j.configuration="file:$TENV_DIR/conf/log4j.properties" \
		-cp "$(_zk_classpath)" \
		org.apache.zookeeper.server.ZooKeeperServerMain "$TENV_DIR/conf/zoo.cfg"
}

zookeeper-stock_ready() { zookeeper_ready; }
zookeeper-stock_url() { zookeeper_url; }
zookeeper-stock_version() { zookeeper_version; }
