// Package migrate moves a live fleet of fencelock clients from one backend
// to another (Redis to PostgreSQL, or any TokenFloorer to any other)
// without a maintenance window, without two holders of a key at any
// moment, and without fencing tokens going backwards at a downstream
// fence.
//
// Two tools do it:
//
//   - Dual, for the rolling-deploy phase: a backend that holds every lease
//     on both the old and the new backend. It acquires old first, then new
//     (the same fixed order in every client, so dual clients and
//     single-backend clients of either side cannot both win or deadlock),
//     renews both, reports the lease lost if either side loses it, and
//     releases both, new first (old, the gate every dual acquire passes
//     first, stays closed until the holder is gone from new). Its token
//     is the larger of the two sides' tokens, and before the grant is
//     returned that token is pushed into the other side's floor, so the
//     next holder on either side, dual or not, gets a higher one.
//   - CopyTokens, for the cut-over: it raises the new backend's token floor
//     above the old backend's high-water marks (per key, and globally when
//     the new backend has a global floor). It is idempotent and safe to
//     re-run while locks are held.
//
// Importing the package registers the "dual" URL scheme with
// fencelock.Open:
//
//	dual://?old=<URL-escaped old backend URL>&new=<URL-escaped new backend URL>
//
// (DualURL builds it.) The runbook, with the three phases, the checks
// between them and the rollback path, is docs/migration.md.
package migrate
