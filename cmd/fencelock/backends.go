package main

// The backends linked into the fencelock command. Each registers its URL
// schemes with fencelock.Register from its init function; `fencelock
// version` lists them.
import (
	_ "github.com/fencelock/fencelock/backend/etcd"
	_ "github.com/fencelock/fencelock/backend/file"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
	_ "github.com/fencelock/fencelock/backend/mongo"
	_ "github.com/fencelock/fencelock/backend/mysql"
	_ "github.com/fencelock/fencelock/backend/nats"
	_ "github.com/fencelock/fencelock/backend/postgres"
	_ "github.com/fencelock/fencelock/backend/redis"
	_ "github.com/fencelock/fencelock/backend/zookeeper"
	_ "github.com/fencelock/fencelock/migrate" // dual://
)
