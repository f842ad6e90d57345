module github.com/fencelock/fencelock/migrate

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	github.com/fencelock/fencelock/backend/postgres v0.0.0-00010101000000-000000000000
	github.com/fencelock/fencelock/backend/redis v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require pgregory.net/rapid v1.3.0 // indirect

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/fencelock/fencelock/conformance/generative v0.0.0
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace (
	github.com/fencelock/fencelock => ..
	github.com/fencelock/fencelock/backend/postgres => ../backend/postgres
	github.com/fencelock/fencelock/backend/redis => ../backend/redis
)

replace github.com/fencelock/fencelock/conformance/generative => ../conformance/generative
