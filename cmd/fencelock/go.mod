module github.com/fencelock/fencelock/cmd/fencelock

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	github.com/fencelock/fencelock/backend/etcd v0.0.0
	github.com/fencelock/fencelock/backend/mongo v0.0.0
	github.com/fencelock/fencelock/backend/mysql v0.0.0
	github.com/fencelock/fencelock/backend/nats v0.0.0
	github.com/fencelock/fencelock/backend/postgres v0.0.0
	github.com/fencelock/fencelock/backend/redis v0.0.0
	github.com/fencelock/fencelock/backend/zookeeper v0.0.0
	github.com/fencelock/fencelock/kit/postgres v0.0.0
	github.com/fencelock/fencelock/kit/redis v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/nats-io/nats.go v1.55.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.5.0 // indirect
	github.com/fencelock/fencelock/migrate v0.0.0
	github.com/fencelock/fencelock/safety v0.0.0
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	github.com/go-zookeeper/zk v1.0.4 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.29.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/xdg-go/pbkdf2 v1.0.0 // indirect
	github.com/xdg-go/scram v1.2.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.etcd.io/etcd/api/v3 v3.6.16 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.6.16 // indirect
	go.etcd.io/etcd/client/v3 v3.6.16 // indirect
	go.mongodb.org/mongo-driver/v2 v2.9.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/grpc v1.83.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/fencelock/fencelock => ../..

replace github.com/fencelock/fencelock/backend/etcd => ../../backend/etcd

replace github.com/fencelock/fencelock/backend/mongo => ../../backend/mongo

replace github.com/fencelock/fencelock/backend/mysql => ../../backend/mysql

replace github.com/fencelock/fencelock/backend/nats => ../../backend/nats

replace github.com/fencelock/fencelock/backend/postgres => ../../backend/postgres

replace github.com/fencelock/fencelock/backend/redis => ../../backend/redis

replace github.com/fencelock/fencelock/backend/zookeeper => ../../backend/zookeeper

replace github.com/fencelock/fencelock/kit/postgres => ../../kit/postgres

replace github.com/fencelock/fencelock/kit/redis => ../../kit/redis

replace github.com/fencelock/fencelock/migrate => ../../migrate

replace github.com/fencelock/fencelock/safety => ../../safety
