package grpcfence

// SetWaitHook sets a function called when a call on a resource starts to
// wait for the resource's lock, held by another call (Serialize).
func SetWaitHook(s *Server, f func(resource string)) { s.testHookWait = f }
