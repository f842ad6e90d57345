module github.com/fencelock/fencelock/observe/prometheus

go 1.25.0

require github.com/fencelock/fencelock v0.0.0

replace github.com/fencelock/fencelock => ../..
