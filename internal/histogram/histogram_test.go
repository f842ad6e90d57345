package histogram

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/fencelock/fencelock"
)

func TestBuckets(t *testing.T) {
	def := []float64{1, 2}
	if got, err := Buckets("X", nil, def); err != nil || !slices.Equal(got, def) {
		t.Fatalf("empty: %v, %v; want the default", got, err)
	}
	if got, err := Buckets("X", []float64{.5, 1, 3}, def); err != nil || !slices.Equal(got, []float64{.5, 1, 3}) {
		t.Fatalf("increasing: %v, %v", got, err)
	}
	for _, bad := range [][]float64{{1, 1}, {2, 1}, {1, math.NaN()}, {math.NaN(), 1}} {
		_, err := Buckets("HoldBuckets", bad, def)
		var ie *fencelock.InvalidOptionError
		if !errors.As(err, &ie) || ie.Option != "HoldBuckets" {
			t.Errorf("Buckets(%v) = %v; want an InvalidOptionError for HoldBuckets", bad, err)
		}
	}
}
