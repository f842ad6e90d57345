package generative

import (
	"errors"
	"slices"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

// rwReplay is a history of read-write lock "L": reader r0 (slot 0,
// token 1) from 10 to 50, writer w (gate, token 2) from 60 to 90, reader
// r1 (slot 1, token 3) from 100 on; each accesses the resource while it
// holds, and r0 reads late at 120.
func rwReplay() Replay {
	prefix, recs := recipe.Keys("L", 0)
	gate, slot0, slot1 := recs[0], prefix+"r/0", prefix+"r/1"
	lease := func(client int, key, owner string, tok fencelock.Token, inv, got, end int64) ReplayLease {
		return ReplayLease{Client: client, Key: key, Owner: owner, Inv: inv, Got: got, End: end, Tokens: []ReplayToken{{tok, got}}}
	}
	return Replay{
		Leases: []ReplayLease{
			lease(0, slot0, "r0", 1, 5, 10, 50),
			lease(1, gate, "w", 2, 55, 60, 90),
			lease(2, slot1, "r1", 3, 95, 100, 0),
		},
		Writes: []ReplayWrite{
			{Lease: 0, Token: 1, Invoked: 20, Returned: 21, Accepted: true},
			{Lease: 1, Token: 2, Invoked: 70, Returned: 71, Accepted: true},
			{Lease: 2, Token: 3, Invoked: 110, Returned: 111, Accepted: true},
			{Lease: 0, Token: 1, Invoked: 120, Returned: 121, Accepted: false, Late: true},
		},
	}
}

func properties(t *testing.T, rp Replay) []string {
	t.Helper()
	vs, err := rp.Check()
	if err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, v := range vs {
		if !slices.Contains(ps, v.Property) {
			ps = append(ps, v.Property)
		}
	}
	slices.Sort(ps)
	return ps
}

// TestReplayChecksReadWriteGrants checks that Replay judges leases on a
// read-write lock's gate and reader slots (recipe.Keys) as that lock's
// grants, and their writes as accesses, with the read-write checks: a
// correct history keeps them, and each defect breaks the one it is about.
func TestReplayChecksReadWriteGrants(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(rp *Replay)
		want   []string
	}{
		{"correct", func(*Replay) {}, nil},
		{"writer beside a reader", func(rp *Replay) { rp.Leases[0].End = 70 }, []string{"NoReaderBesideWriter"}},
		{"two writers", func(rp *Replay) {
			_, recs := recipe.Keys("L", 0)
			rp.Leases[2].Key = recs[0] // r1 is a second writer, granted while w held
			rp.Leases[1].End = 0
			rp.Writes = rp.Writes[:2]
		}, []string{"NoTwoHolders", "NoTwoWriters"}},
		{"grant token goes down", func(rp *Replay) {
			rp.Leases[2].Tokens[0].Token = 2
			rp.Writes[2].Token = 2
		}, []string{"GrantTokensIncrease"}},
		{"stale access accepted", func(rp *Replay) { rp.Writes[3].Accepted = true }, []string{"NoStaleAccessAccepted"}},
	} {
		rp := rwReplay()
		tc.mutate(&rp)
		if got := properties(t, rp); !slices.Equal(got, tc.want) {
			vs, _ := rp.Check()
			t.Errorf("%s: broken %v, want %v\n%v", tc.name, got, tc.want, vs)
		}
	}
}

// TestReplayKeepsIntentAndSemaphoreLeasesPlain checks that a lease on a
// writer's intent record or on a semaphore's slot is judged as a plain
// lease: its write is a fenced write, not an access.
func TestReplayKeepsIntentAndSemaphoreLeasesPlain(t *testing.T) {
	_, rw := recipe.Keys("L", 0)
	_, sem := recipe.Keys("S", 2)
	for _, key := range []string{rw[1], sem[0]} {
		rp := Replay{
			Leases: []ReplayLease{
				{Key: key, Owner: "a", Inv: 1, Got: 2, End: 5, Tokens: []ReplayToken{{2, 2}}},
				{Key: key, Owner: "b", Inv: 6, Got: 7, Tokens: []ReplayToken{{3, 7}}},
			},
			Writes: []ReplayWrite{
				{Lease: 1, Token: 3, Invoked: 8, Returned: 8, Accepted: true},
				{Lease: 0, Token: 2, Invoked: 9, Returned: 9, Accepted: true, Late: true},
			},
		}
		if got := properties(t, rp); !slices.Equal(got, []string{"NoStaleWriteAccepted"}) {
			t.Errorf("%q: broken %v, want [NoStaleWriteAccepted]", key, got)
		}
	}
	if _, err := (Replay{Leases: []ReplayLease{{Key: rw[0], Owner: "a"}}}).Check(); !errors.Is(err, ErrMalformedReplay) {
		t.Errorf("a grant without a token: %v, want ErrMalformedReplay", err)
	}
}
