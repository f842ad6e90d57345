module github.com/fencelock/fencelock/bench/mysql

go 1.26.0

require github.com/fencelock/fencelock v0.0.0

replace github.com/fencelock/fencelock => ../..

replace github.com/fencelock/fencelock/backend/mysql => ../../backend/mysql

require (
	github.com/fencelock/fencelock/backend/mysql v0.0.0
	github.com/go-sql-driver/mysql v1.10.1
)

require filippo.io/edwards25519 v1.2.0 // indirect
