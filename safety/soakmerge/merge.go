package main

import (
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/report"
)

// mergeCells folds the cells of one row and fault that several shards
// ran (a long cell split by rounds over clusters of its own) into one
// cell, in the order each (row, fault) first appears. Counts add up; a
// property holds only if it held in every shard; the verdict is judged
// again from the merged result. The distributions keep their exact
// count, minimum and maximum; their median and 99th percentile become
// the largest of the shards', an upper bound of the merged ones.
func mergeCells(cells []report.Cell) []report.Cell {
	type key struct{ backend, fault string }
	at := map[key]int{}
	var out []report.Cell
	for _, c := range cells {
		k := key{c.Backend, c.Fault}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, c)
			continue
		}
		out[i] = mergeCell(out[i], c)
	}
	return out
}

// mergeCell is a and b, two shards of one cell, as one cell.
func mergeCell(a, b report.Cell) report.Cell {
	m := a
	m.Duration += b.Duration
	m.Rounds += b.Rounds
	m.Calls = append(append([]report.CallBound(nil), a.Calls...), b.Calls...)
	m.Result = mergeResult(a.Result, b.Result, a.Config.MaxViolations)
	m.Verdict = report.Classify(m.Result, m.Expect)
	return m
}

func mergeResult(a, b check.Result, maxViolations int) check.Result {
	var r check.Result
	for _, p := range a.Properties {
		q, ok := b.Property(p.ID)
		if ok {
			p.OK = p.OK && q.OK
			p.Checked += q.Checked
			p.Count += q.Count
			p.Violations = append(append([]check.Violation(nil), p.Violations...), q.Violations...)
			if maxViolations > 0 && len(p.Violations) > maxViolations {
				p.Violations = p.Violations[:maxViolations]
			}
		}
		r.Properties = append(r.Properties, p)
	}
	for _, q := range b.Properties {
		if _, ok := a.Property(q.ID); !ok {
			r.Properties = append(r.Properties, q)
		}
	}
	r.Stats = mergeStats(a.Stats, b.Stats)
	return r
}

func mergeStats(a, b check.Stats) check.Stats {
	s := a
	s.Span += b.Span
	s.Keys = max(a.Keys, b.Keys)
	s.Acquisitions += b.Acquisitions
	s.AcquireFailures += b.AcquireFailures
	s.Ambiguous += b.Ambiguous
	s.Releases += b.Releases
	s.Losses += b.Losses
	s.Faults += b.Faults
	s.Crashes += b.Crashes
	s.Pauses += b.Pauses
	s.StaleOps += b.StaleOps
	s.Writes += b.Writes
	s.WritesAccepted += b.WritesAccepted
	s.FencingOffWrites += b.FencingOffWrites
	s.StaleAttempted += b.StaleAttempted
	s.StaleAccepted += b.StaleAccepted
	s.StaleAcceptedEarly += b.StaleAcceptedEarly
	s.Rotations += b.Rotations
	s.RotatedAccepted += b.RotatedAccepted
	s.OldTokenWrites += b.OldTokenWrites
	s.OldTokenAccepted += b.OldTokenAccepted
	s.BatchRenewals += b.BatchRenewals
	s.MaxBatch = max(a.MaxBatch, b.MaxBatch)
	s.Waits += b.Waits
	s.BatchAcquires += b.BatchAcquires
	s.MaxAcquireBatch = max(a.MaxAcquireBatch, b.MaxAcquireBatch)
	s.BatchReleases += b.BatchReleases
	s.MaxReleaseBatch = max(a.MaxReleaseBatch, b.MaxReleaseBatch)
	s.Tokens += b.Tokens
	s.MaxToken = max(a.MaxToken, b.MaxToken)
	s.MaxOverlap = max(a.MaxOverlap, b.MaxOverlap)
	s.DetectionMargin = mergeDist(a.DetectionMargin, b.DetectionMargin)
	s.OrphanTime = mergeDist(a.OrphanTime, b.OrphanTime)
	s.Recovery = mergeDist(a.Recovery, b.Recovery)
	s.MaxHolders = max(a.MaxHolders, b.MaxHolders)
	return s
}

// mergeDist: N, Min and Max exact; P50 and P99 the larger of the two, an
// upper bound (at least half, and 99%, of each shard's samples are at
// most its own P50 and P99, so of all samples at most the larger).
func mergeDist(a, b check.Dist) check.Dist {
	switch {
	case a.N == 0:
		return b
	case b.N == 0:
		return a
	}
	return check.Dist{
		N:   a.N + b.N,
		Min: min(a.Min, b.Min),
		P50: max(a.P50, b.P50),
		P99: max(a.P99, b.P99),
		Max: max(a.Max, b.Max),
	}
}

// stillNotRun is notRun without duplicates and without the cells some
// shard ran.
func stillNotRun(notRun []report.NotRun, ran []report.Cell) []report.NotRun {
	type key struct{ backend, fault string }
	seen := map[key]bool{}
	for _, c := range ran {
		seen[key{c.Backend, c.Fault}] = true
	}
	var out []report.NotRun
	for _, n := range notRun {
		k := key{n.Backend, n.Fault}
		if !seen[k] {
			seen[k] = true
			out = append(out, n)
		}
	}
	return out
}

// shardProfile names the profile of a merge of shards run with the given
// profiles: "soak (200 rounds), 5 shards", or each distinct profile with
// its count when they differ.
func shardProfile(profiles []string) string {
	if len(profiles) == 1 {
		return profiles[0]
	}
	var distinct []string
	count := map[string]int{}
	for _, p := range profiles {
		if count[p] == 0 {
			distinct = append(distinct, p)
		}
		count[p]++
	}
	if len(distinct) == 1 {
		return fmt.Sprintf("%s, %d shards", distinct[0], len(profiles))
	}
	parts := make([]string, len(distinct))
	for i, p := range distinct {
		parts[i] = fmt.Sprintf("%d × %s", count[p], p)
	}
	return fmt.Sprintf("%d shards: %s", len(profiles), strings.Join(parts, " + "))
}
