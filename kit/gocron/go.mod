module github.com/fencelock/fencelock/kit/gocron

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	github.com/go-co-op/gocron/v2 v2.21.2
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
)

replace github.com/fencelock/fencelock => ../..
