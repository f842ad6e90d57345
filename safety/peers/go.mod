module github.com/fencelock/fencelock/safety/peers

go 1.26.0

require (
	github.com/bsm/redislock v0.9.4
	github.com/fencelock/fencelock/safety v0.0.0
	github.com/go-redsync/redsync/v4 v4.17.0
	github.com/go-zookeeper/zk v1.0.4
	github.com/redis/go-redis/v9 v9.23.0
	go.etcd.io/etcd/client/v3 v3.6.16
	golang.org/x/sys v0.49.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.5.0 // indirect
	github.com/fencelock/fencelock v0.0.0 // indirect
	github.com/fencelock/fencelock/kit/etcd v0.0.0-00010101000000-000000000000 // indirect
	github.com/fencelock/fencelock/kit/postgres v0.0.0-00010101000000-000000000000 // indirect
	github.com/fencelock/fencelock/kit/redis v0.0.0-00010101000000-000000000000 // indirect
	github.com/fencelock/fencelock/migrate v0.0.0-00010101000000-000000000000 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.29.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.etcd.io/etcd/api/v3 v3.6.16 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.6.16 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/grpc v1.83.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/fencelock/fencelock => ../..
	github.com/fencelock/fencelock/backend/etcd => ../../backend/etcd
	github.com/fencelock/fencelock/backend/mongo => ../../backend/mongo
	github.com/fencelock/fencelock/backend/mysql => ../../backend/mysql
	github.com/fencelock/fencelock/backend/nats => ../../backend/nats
	github.com/fencelock/fencelock/backend/postgres => ../../backend/postgres
	github.com/fencelock/fencelock/backend/redis => ../../backend/redis
	github.com/fencelock/fencelock/backend/zookeeper => ../../backend/zookeeper
	github.com/fencelock/fencelock/kit/etcd => ../../kit/etcd
	github.com/fencelock/fencelock/kit/postgres => ../../kit/postgres
	github.com/fencelock/fencelock/kit/redis => ../../kit/redis
	github.com/fencelock/fencelock/migrate => ../../migrate
	github.com/fencelock/fencelock/safety => ..
)
