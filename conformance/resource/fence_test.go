package resource_test

import (
	"context"
	"sync"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
)

// memResource is fencelock.Fence in front of a map: the rule in memory.
type memResource struct {
	fence fencelock.Fence
	mu    sync.Mutex
	vals  map[string]string
}

func (m *memResource) Write(_ context.Context, name string, token fencelock.Token, holder, value string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fence.Check(name, token, holder); err != nil {
		return err
	}
	if m.vals == nil {
		m.vals = map[string]string{}
	}
	m.vals[name] = value
	return nil
}

func (m *memResource) Read(_ context.Context, name string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[name]
	return v, ok, nil
}

// TestFencePassesTheResourceSuite runs the suite on fencelock.Fence.
func TestFencePassesTheResourceSuite(t *testing.T) {
	r := &memResource{}
	resource.Run(t, resource.Harness{Resource: func(*testing.T) resource.Resource { return r }})
}
