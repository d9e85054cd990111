//go:build unix

package wire_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/resin-llm/resin/core/wire"
)

// TestRunnerErrorsHideEnvValues: the runner is named in the errors of the requests it
// fails and in Health (served unauthenticated on /health) with the values of its
// command line's leading VAR=value words hidden: such words carry credentials (a hub
// token), which every client saw before. The rest of the command line is kept.
func TestRunnerErrorsHideEnvValues(t *testing.T) {
	t.Setenv(helperEnv, "1")
	self, _ := os.Executable()
	const secret = "hf_s3cret"
	spec := "exec:RESIN_TEST_TOKEN=" + secret + " RESIN_TEST_QUOTED='a " + secret + " b' " + self
	r, err := wire.Dial(context.Background(), wire.Config{Spec: spec, NoRestart: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := syscall.Kill(r.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Health to report the death", func() bool { return r.Health() != nil })
	_, stepErr := r.Execute(context.Background(), bigPlan(16))
	for what, err := range map[string]error{"health": r.Health(), "step": stepErr} {
		if err == nil {
			t.Fatalf("%s: no error from a dead runner", what)
		}
		msg := err.Error()
		if strings.Contains(msg, secret) || !strings.Contains(msg, "RESIN_TEST_TOKEN=*** RESIN_TEST_QUOTED=*** "+self) {
			t.Errorf("%s: %q, want the runner named with its env values hidden", what, msg)
		}
	}
	if !errors.Is(r.Health(), wire.ErrRunnerDown) {
		t.Fatalf("health %v, want ErrRunnerDown", r.Health())
	}
}
