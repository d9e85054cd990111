//go:build unix

package serve

import (
	"syscall"
	"testing"
)

// Under a low file descriptor limit the connection cap leaves room for the process's
// other files, so a flood of clients waits for slots instead of making every accept
// fail for lack of descriptors.
func TestConnCapFitsFDLimit(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Skip(err)
	}
	low := rl
	low.Cur = 256
	if rl.Cur < low.Cur {
		t.Skipf("the fd limit is already %d", rl.Cur)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	got, small := fitFDLimit(defaultMaxConnections), fitFDLimit(100)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if got != 256-fdReserve || small != 100 {
		t.Fatalf("caps %d and %d under an fd limit of 256, want %d and 100", got, small, 256-fdReserve)
	}
	if rl.Cur >= defaultMaxConnections+fdReserve {
		if got := fitFDLimit(defaultMaxConnections); got != defaultMaxConnections {
			t.Fatalf("cap %d under an fd limit of %d, want %d", got, rl.Cur, defaultMaxConnections)
		}
	}
}
