package mongofence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"

	mongofence "github.com/fencelock/fencelock/kit/mongo"
)

// Credit an account under a lock, fenced: the document changes only if
// the lease's token passes the fencing rule, in the same update. The
// example needs a server (FENCELOCK_TEST_MONGO), so it has no checked
// output.
func Example() {
	uri := os.Getenv("FENCELOCK_TEST_MONGO")
	if uri == "" {
		return
	}
	ctx := context.Background()
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Disconnect(ctx)
	accounts := client.Database("app").Collection("accounts")

	locks, err := fencelock.New(memory.New(), nil) // any backend
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	err = locks.Do(ctx, "accounts/1", func(ctx context.Context, l *fencelock.Lease) error {
		_, err := mongofence.UpdateOne(ctx, accounts,
			bson.D{{Key: "_id", Value: 1}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: 100}}}},
			l.Token(), l.Owner())
		return err
	})
	switch {
	case errors.Is(err, fencelock.ErrStaleToken):
		fmt.Println("refused: a later holder has written")
	case errors.Is(err, mongo.ErrNoDocuments):
		fmt.Println("no account 1")
	case err != nil:
		log.Fatal(err)
	}
}
