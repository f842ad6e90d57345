module github.com/fencelock/fencelock/backend/mysql

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	github.com/go-sql-driver/mysql v1.10.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)

replace github.com/fencelock/fencelock => ../..
