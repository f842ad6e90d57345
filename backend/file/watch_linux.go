package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Watcher = (*Backend)(nil)

// Watch implements driver.Watcher on Linux with inotify(7): the channel
// receives a value whenever the key's state file is written (a release, a
// force-release, but also every renewal of the holder: wake-ups are often
// spurious, which the contract allows). A watch costs one inotify instance
// and one goroutine, both ended when ctx ends or the Backend is closed.
// When the per-user inotify limit is reached, Watch fails and the engine
// polls.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("file: inotify: %w", err)
	}
	// A non-blocking descriptor joins Go's poller, so Close ends a Read.
	f := os.NewFile(uintptr(fd), "inotify")
	path := filepath.Join(b.dir, fileName(key)+".json")
	if _, err := syscall.InotifyAddWatch(fd, path, syscall.IN_MODIFY|syscall.IN_CLOSE_WRITE|syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF|syscall.IN_ATTRIB); err != nil {
		f.Close()
		return nil, fmt.Errorf("file: inotify watch %s: %w", path, err)
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		f.Close()
		return nil, driver.ErrClosed
	}
	if b.watches == nil {
		b.watches = make(map[*os.File]struct{})
	}
	b.watches[f] = struct{}{}
	b.wg.Add(1)
	b.mu.Unlock()

	ch := make(chan struct{}, 1)
	stop := context.AfterFunc(ctx, func() { b.endWatch(f) })
	go func() {
		defer b.wg.Done()
		defer close(ch)
		defer stop()
		defer b.endWatch(f)
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			if err != nil || n == 0 {
				if err != nil && !errors.Is(err, os.ErrClosed) {
					_ = err // the watch ends; the engine keeps polling
				}
				return
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch, nil
}

// endWatch closes a watch's inotify instance (once), which ends its
// goroutine's Read.
func (b *Backend) endWatch(f *os.File) {
	b.mu.Lock()
	_, ok := b.watches[f]
	delete(b.watches, f)
	b.mu.Unlock()
	if ok {
		f.Close()
	}
}

// closeWatches ends every watch and waits for their goroutines.
func (b *Backend) closeWatches() {
	b.mu.Lock()
	fs := make([]*os.File, 0, len(b.watches))
	for f := range b.watches {
		fs = append(fs, f)
	}
	b.mu.Unlock()
	for _, f := range fs {
		b.endWatch(f)
	}
	b.wg.Wait()
}
