package generative

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// TestStallsOfEveryStreamPushBoundsBack checks that the Options.Stall a
// run resolves records each stall, so that the bounds on how soon the
// store answers (ResignFreesKey's) count from the end of a stall that
// any stream's program started.
func TestStallsOfEveryStreamPushBoundsBack(t *testing.T) {
	var stalled time.Duration
	o := (&Options{Stall: func(_ context.Context, d time.Duration) { stalled = d }}).resolve()
	before := time.Now()
	if got := o.stalls.answersFrom(before); !got.Equal(before) {
		t.Fatalf("no stall yet: answersFrom(t) = t%+v, want t", got.Sub(before))
	}
	o.Stall(context.Background(), time.Hour)
	if stalled != time.Hour {
		t.Fatalf("the backend's Stall got %v, want 1h", stalled)
	}
	if got := o.stalls.answersFrom(before); got.Sub(before) < time.Hour {
		t.Fatalf("a bound begun before a 1h stall counts from t+%v, want at least t+1h", got.Sub(before))
	}
	after := before.Add(2 * time.Hour)
	if got := o.stalls.answersFrom(after); !got.Equal(after) {
		t.Fatalf("a bound begun after the stall ended counts from t%+v, want t", got.Sub(after))
	}
	if got := (&Options{}).resolve().stalls.answersFrom(before); !got.Equal(before) {
		t.Fatalf("without Options.Stall: answersFrom(t) = t%+v, want t", got.Sub(before))
	}
}

// TestPerStreamStallReachesItsOwnStreamAlone checks that with
// Options.PerStream each stream opens its clients and stalls them with
// what PerStream returned for its index, and that a stall drawn in one
// stream pushes back the bounds of that stream's programs alone (each
// stream's Stall is logged on its own).
func TestPerStreamStallReachesItsOwnStreamAlone(t *testing.T) {
	var stalled [2]time.Duration
	opened := -1
	o := (&Options{PerStream: func(i int) Stream {
		return Stream{
			Open:  func(context.Context) (driver.Backend, error) { opened = i; return nil, nil },
			Stall: func(_ context.Context, d time.Duration) { stalled[i] += d },
		}
	}}).resolve()
	var hs [2]conformance.Harness
	var sos [2]*Options
	for i := range 2 {
		h, so, err := o.forStream(i, conformance.Harness{})
		if err != nil {
			t.Fatal(err)
		}
		hs[i], sos[i] = h, so
	}
	if _, _ = hs[1].Open(context.Background()); opened != 1 {
		t.Fatalf("stream 1's Harness.Open is stream %d's, want its own", opened)
	}
	before := time.Now()
	sos[0].Stall(context.Background(), time.Hour)
	if stalled != [2]time.Duration{time.Hour, 0} {
		t.Fatalf("stream 0's stall of 1h reached the streams' Stalls as %v, want [1h 0s]", stalled)
	}
	if got := sos[0].stalls.answersFrom(before); got.Sub(before) < time.Hour {
		t.Fatalf("stream 0's bound begun before its 1h stall counts from t+%v, want at least t+1h", got.Sub(before))
	}
	if got := sos[1].stalls.answersFrom(before); !got.Equal(before) {
		t.Fatalf("stream 1's bound counts from t%+v after stream 0's stall, want t", got.Sub(before))
	}
	bad := (&Options{PerStream: func(int) Stream { return Stream{} }}).resolve()
	if _, _, err := bad.forStream(0, conformance.Harness{}); err == nil {
		t.Fatal("a Stream without Open was accepted")
	}
}
