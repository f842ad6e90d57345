package benchkit

import "testing"

// CPUPerOp starts measuring this process's CPU time (user and system, of
// every goroutine, the garbage collector's included); the function it
// returns, called after the benchmark's loop, reports that time per
// iteration as "cpu-ns/op". On a machine shared with other work, the
// wall-clock ns/op counts the time this process waited for a core too;
// cpu-ns/op counts only the work it did. It reports nothing where the
// platform's CPU time is not measured.
func CPUPerOp(b *testing.B) (report func()) {
	start := processCPU()
	return func() {
		end := processCPU()
		if start < 0 || end < 0 || b.N == 0 {
			return
		}
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}
