//go:build !amd64

package ref

// AMXStatus says whether this process may run AMX tile instructions, and why not.
type AMXStatus struct {
	CPU, BF16, Int8, OSEnabled, Granted bool
	Reason                              string
}

// AMX reports no AMX: it is an x86 extension.
func AMX() AMXStatus { return AMXStatus{Reason: "not an x86-64 CPU"} }
