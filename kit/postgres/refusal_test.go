package pgfence

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencelock/fencelock"
)

// driverError is a database/sql driver's error that is not pgx's: a
// SQLState method, and the server's message behind a prefix (as lib/pq's
// "pq: " is).
type driverError struct{ code, msg string }

func (e driverError) Error() string    { return "pq: " + e.msg }
func (e driverError) SQLState() string { return e.code }

// A refusal is recognized by its SQLSTATE from any driver whose errors
// have a SQLState method, with the highest token read from the message;
// other errors are not refusals.
func TestRefusalFromAnyDriver(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", driverError{StaleSQLState, "stale fencing token 4 for 'x (highest accepted 9)' (highest accepted 5)"})
	var se *fencelock.StaleTokenError
	if got := refusal(err, "r", 4); !errors.As(got, &se) || se.Resource != "r" || se.Token != 4 || se.Highest != 5 {
		t.Errorf("refusal = %v; want a StaleTokenError for r, token 4, highest 5", got)
	}
	for _, err := range []error{
		driverError{"23505", "duplicate key value violates unique constraint"},
		errors.New("stale fencing token 4 for 'r' (highest accepted 5)"),
	} {
		if got := refusal(err, "r", 4); got != nil {
			t.Errorf("refusal(%v) = %v; want nil", err, got)
		}
	}
}
