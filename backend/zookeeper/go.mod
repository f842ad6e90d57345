module github.com/fencelock/fencelock/backend/zookeeper

go 1.26.0

require github.com/fencelock/fencelock v0.0.0

require github.com/go-zookeeper/zk v1.0.4

require go.uber.org/goleak v1.3.0

require pgregory.net/rapid v1.3.0 // indirect

replace github.com/fencelock/fencelock => ../..
