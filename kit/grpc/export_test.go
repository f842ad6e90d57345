package grpcfence

// SetWaitHooks sets functions called when a call on a resource starts to
// wait for the resource's lock, held by another call, and when a call
// gives up waiting because its context ended.
func SetWaitHooks(s *Server, waiting, gaveUp func(resource string)) {
	s.testHookWait, s.testHookGaveUp = waiting, gaveUp
}
