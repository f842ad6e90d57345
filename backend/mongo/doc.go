// Package mongo is fencelock's MongoDB backend, on
// go.mongodb.org/mongo-driver/v2. It runs on MongoDB and on the Mongo-wire
// stores that insert a document under a unique index atomically (FerretDB,
// Azure Cosmos DB for MongoDB, Amazon DocumentDB): a lock is a record
// inserted under a unique index and never updated, every later move of it
// is the unique insert of an immutable claim, and fencing tokens are
// issued by the unique insert of their claim. Expiry is judged by the
// server's clock, estimated from hello's localTime (ClockBound).
//
// Importing it registers the mongodb:// and mongodb+srv:// URL schemes
// with fencelock.Open:
//
//	import _ "github.com/fencelock/fencelock/backend/mongo"
//
//	c, err := fencelock.Open(ctx, "mongodb://db1,db2,db3/app?replicaSet=rs0&namespace=billing", nil)
//
// or, on a client the application already has (the backend never
// disconnects it, and the client's own driver settings apply):
//
//	b, err := mongo.New(ctx, client, &mongo.Options{Database: "app", Namespace: "billing"})
//	c, err := fencelock.New(b, nil)
//
// Open makes its own client (Close disconnects it). See
// https://github.com/fencelock/fencelock/blob/main/docs/backends/mongo.md
// for the guarantees, the caveats (where it is tested, GarbageAfter,
// the clock estimate, unreachable servers) and the design: the documents,
// the operations and why they are safe, and FerretDB's layout.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	mongodb://[user[:password]@]host[:port][,host[:port]...][/database][?params]
//	mongodb+srv://… (the same, hosts from DNS SRV)
//
// for example
//
//	mongodb://app:secret@db1,db2,db3/app?replicaSet=rs0&namespace=billing&w=majority
//
// Schemes are case-insensitive; ports must be 1 to 65535. Parameters of
// this package (each optional):
//
//   - database: Options.Database (default the URL's path, as in
//     mongodb://host/app, else "fencelock").
//   - collection: Options.Collection, the lock records and epoch claims
//     (default "fencelock_locks"; token claims: the same collection, or on
//     FerretDB the TokenShards collections TokenCollections names).
//   - namespace: Options.Namespace, keeps applications apart in one
//     collection (default "default").
//   - clock_resync: Options.ClockResync, how often the estimate of the
//     server's clock is sampled again (a Go duration, default 30s).
//
// Every other parameter must be a MongoDB connection-string option
// (replicaSet, authSource, tls, appName, maxPoolSize, w, journal,
// readConcernLevel, ...) and goes to the driver. w, journal and
// readConcernLevel replace the backend's majority, journaled defaults
// (Describe warns when they are weaker); serverSelectionTimeoutMS and
// connectTimeoutMS default to DefaultServerSelectionTimeout and
// DefaultConnectTimeout (5s each, not the driver's 30s). A parameter that
// is neither is refused with a *driver.InvalidOptionError, so a typo
// never silently drops a setting. fencelock.Open also accepts the
// engine's parameters (ttl, renew_interval, margin, rotate_every, owner,
// lock_delay, require)
// and removes them before this package sees the URL. A Backend opened
// from a URL uses the GarbageAfter recorded in the collection (see
// GarbageAfterError).
//
// No credential from the URL appears in an error or Describe: URLs are
// shown through driver.RedactURL (the password and credential-bearing
// parameters such as authMechanismProperties, proxyPassword and
// tlsCertificateKeyFilePassword), and the driver's errors are wrapped
// with driver.RedactError.
package mongo
