// Package histogram holds what the metrics adapters (observe/prometheus,
// observe/otel) share about histogram buckets.
package histogram

import (
	"fmt"

	"github.com/fencelock/fencelock"
)

// Buckets returns the bucket boundaries of option: def if v is empty,
// else v, which must be strictly increasing (a *fencelock.InvalidOptionError
// naming option otherwise). NaN is never increasing, so it is rejected.
func Buckets(option string, v, def []float64) ([]float64, error) {
	if len(v) == 0 {
		return def, nil
	}
	for i := 1; i < len(v); i++ {
		if !(v[i] > v[i-1]) {
			return v, &fencelock.InvalidOptionError{Option: option, Value: fmt.Sprint(v), Reason: "must be strictly increasing"}
		}
	}
	return v, nil
}
