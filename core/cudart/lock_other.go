//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package cudart

import "sync"

var lockMu sync.Map // path → *sync.Mutex

// lockFile serialises holders of path within this process (no cross-process lock on this
// platform).
func lockFile(path string) (func(), error) {
	m, _ := lockMu.LoadOrStore(path, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock, nil
}
