package generative

import (
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

func leader(owner string, token fencelock.Token) recipe.Leader {
	return recipe.Leader{Key: "k", Identity: "c1", Value: []byte("v"), Token: token, Owner: owner}
}

func observeViolations(led []string, ls ...recipe.Leader) []violation {
	e := &electRun{published: map[string]map[string]bool{"c1": {"v": true}}}
	for _, o := range led {
		e.terms = append(e.terms, electTerm{owner: o})
	}
	e.checkObserved(ls)
	return e.vs
}

// Found running TestMemory's elections: a call's attempt made a record
// whose reply was lost, the call gave up on a store failed for a TTL and
// removed it by owner, and another attempt of the same call, still on its
// way, landed after that under the same owner and a higher token. No
// campaigner led under that owner: it is a new record of one call's
// attempts, not a replaced lease delivered again.
func TestObserveOwnerWithoutLeaseMayComeBackUnderHigherToken(t *testing.T) {
	none := recipe.Leader{Key: "k"}
	if vs := observeViolations(nil, leader("c1.3", 4), none, leader("c1.3", 5)); len(vs) != 0 {
		t.Errorf("an owner nobody led under, back under a higher token: %v; want no violation", vs)
	}
}

// The rule still fails a lease delivered after it was replaced: an owner
// a campaigner led under (whatever its token), or any owner's record
// delivered again under the same token.
func TestObserveReplacedLeaseNeverDeliveredAgain(t *testing.T) {
	none := recipe.Leader{Key: "k"}
	if vs := observeViolations([]string{"c0.3"}, leader("c0.3", 3), none, leader("c0.3", 4)); len(vs) != 1 {
		t.Errorf("an owner a campaigner led under, back after it was gone: violations %v; want ObserveInOrder", vs)
	}
	if vs := observeViolations(nil, leader("c1.3", 4), none, leader("c1.3", 4)); len(vs) != 1 {
		t.Errorf("a record delivered again after it was gone: violations %v; want ObserveInOrder", vs)
	}
	if vs := observeViolations(nil, leader("c1.3", 4), leader("c2.1", 6), leader("c1.3", 5)); len(vs) != 1 {
		t.Errorf("a lower token after a higher one: violations %v; want ObserveInOrder", vs)
	}
}
