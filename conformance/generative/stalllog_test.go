package generative

import (
	"context"
	"testing"
	"time"
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
