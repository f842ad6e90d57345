module github.com/fencelock/fencelock/bench/zookeeper

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	github.com/fencelock/fencelock/backend/zookeeper v0.0.0
)

require github.com/go-zookeeper/zk v1.0.4

replace github.com/fencelock/fencelock => ../..

replace github.com/fencelock/fencelock/backend/zookeeper => ../../backend/zookeeper
