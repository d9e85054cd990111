package ref

import (
	"strings"
	"testing"
)

// TestAMXStatus: AMX is granted only with the CPU's AMX-TILE and the OS's tile state, and
// a refusal names the step that refused (CPUID, XCR0 or arch_prctl).
func TestAMXStatus(t *testing.T) {
	s := AMX()
	t.Logf("AMX: %+v", s)
	switch {
	case s.Reason == "":
		t.Fatal("no reason given")
	case s.Granted && (!s.CPU || !s.OSEnabled):
		t.Fatalf("granted without the CPU (%v) or the OS (%v) having AMX", s.CPU, s.OSEnabled)
	case !s.CPU && !strings.Contains(s.Reason, "no AMX") && !strings.Contains(s.Reason, "x86-64"):
		t.Fatalf("no AMX-TILE, but the reason is %q", s.Reason)
	case s.CPU && !s.OSEnabled && !s.Granted && !strings.Contains(s.Reason, "XCR0") && !strings.Contains(s.Reason, "XSAVE"):
		t.Fatalf("the OS has no tile state, but the reason is %q", s.Reason)
	case s.OSEnabled && !s.Granted && !strings.Contains(s.Reason, "arch_prctl") && !strings.Contains(s.Reason, "this OS"):
		t.Fatalf("refused by the OS, but the reason is %q", s.Reason)
	}
	if again := AMX(); again != s {
		t.Fatalf("a second check says %+v", again)
	}
}
