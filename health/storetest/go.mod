module github.com/fencelock/fencelock/health/storetest

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	github.com/fencelock/fencelock/backend/redis v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.22.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
)

replace (
	github.com/fencelock/fencelock => ../..
	github.com/fencelock/fencelock/backend/redis => ../../backend/redis
)
