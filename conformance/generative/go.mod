module github.com/fencelock/fencelock/conformance/generative

go 1.26.0

require (
	github.com/fencelock/fencelock v0.0.0
	pgregory.net/rapid v1.3.0
)

replace github.com/fencelock/fencelock => ../..
