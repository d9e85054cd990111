//go:build !unix

package ref

import "time"

// processCPU returns 0: this platform's CPU time is not read here.
func processCPU() time.Duration { return 0 }
