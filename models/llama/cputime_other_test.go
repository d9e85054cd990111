//go:build !unix

package llama

import "time"

// processCPU returns 0: this platform's CPU time is not read here.
func processCPU() time.Duration { return 0 }
