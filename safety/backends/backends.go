// Package backends links every fencelock backend into the safety harness
// and its contender processes, so that a backend URL from the test
// environment opens the real driver.
package backends

import (
	_ "github.com/fencelock/fencelock/backend/etcd"      // etcd://
	_ "github.com/fencelock/fencelock/backend/mongo"     // mongodb://
	_ "github.com/fencelock/fencelock/backend/mysql"     // mysql://, mariadb://
	_ "github.com/fencelock/fencelock/backend/nats"      // nats://
	_ "github.com/fencelock/fencelock/backend/postgres"  // postgres://
	_ "github.com/fencelock/fencelock/backend/redis"     // redis://
	_ "github.com/fencelock/fencelock/backend/zookeeper" // zk://
	_ "github.com/fencelock/fencelock/migrate"           // dual:// (migrate.Dual over two of the above)
)
