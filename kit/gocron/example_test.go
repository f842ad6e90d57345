package gocronlock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://; use your store's URL
	gocronlock "github.com/fencelock/fencelock/kit/gocron"
	"github.com/go-co-op/gocron/v2"
)

// Every instance of a service runs the same scheduler; the Locker lets
// one instance take each run of each job. MinHold keeps a fast run's key
// taken for the rest of the tick, so an instance that fires the same tick
// a little later skips it rather than running it again.
func ExampleNewLocker() {
	ctx := context.Background()
	c, err := fencelock.Open(ctx, "mem://example-gocron-locker", nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	locker := gocronlock.NewLocker(c, &gocronlock.LockerOptions{MinHold: 30 * time.Second})
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		panic(err)
	}
	ran := make(chan fencelock.Token, 1)
	_, err = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), // in production: gocron.DurationJob(time.Minute), …
		gocron.NewTask(func() {
			// The run's lease: stop on its Context, fence writes with its Token.
			ran <- locker.Lease("nightly-report").Token()
		}),
		gocron.WithName("nightly-report"), // the job's name is its lock key
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	defer s.Shutdown()
	fmt.Println("ran with token", <-ran)
	// Output: ran with token 1
}

// The Elector campaigns for one key in the background: only the
// instance holding it runs jobs, and it stops running them the moment
// its lease is lost.
func ExampleNewElector() {
	ctx := context.Background()
	c, err := fencelock.Open(ctx, "mem://example-gocron-elector", nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	leading := make(chan struct{})
	elector, err := gocronlock.NewElector(c, "scheduler-leader", &gocronlock.ElectorOptions{
		OnStartedLeading: func(*fencelock.Lease) { close(leading) },
	})
	if err != nil {
		panic(err)
	}
	defer elector.Close() // resign when the service stops
	<-leading

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		panic(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() { close(ran) }),
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	defer s.Shutdown()
	<-ran
	fmt.Println("the leader ran the job")
	// Output: the leader ran the job
}
