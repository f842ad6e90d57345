// Package backendkit holds the small pieces of logic that several of this
// repository's backends need alike: a percent-escape codec for lock keys
// (Codec), a memory of recently contended keys (HotSet) and a set of
// records whose clean-up failed and is to be tried again (Orphans).
//
// It is internal on purpose. Its types carry tuning (a HotSet's lifetime, a
// sweep's batch size) and shapes that suit the backends here; exporting
// them would freeze both before 1.0. What a third-party backend needs to
// meet the contract lives in package driver: key and TTL validation
// (driver.CheckKey, driver.CheckTTL), URL parameters (driver.NewParams) and
// redaction (driver.RedactURL, driver.RedactError).
//
// Nothing here sleeps, loops to retry or starts a goroutine: a backend
// calls these from its own methods, which the engine drives.
package backendkit
