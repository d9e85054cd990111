// Package clitest runs a runtime's serve command (core/cli.ServeCmd) in process for tests:
// it starts the command, waits for the "serving url=..." line it logs once listening, and
// keeps the log for assertions.
package clitest

import (
	"bufio"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Server is a serve command running in process.
type Server struct {
	// URL is the root the server listens on (http://HOST:PORT).
	URL     string
	done    chan error
	logDone chan struct{}
	logs    strings.Builder
}

var servingURL = regexp.MustCompile(`url=(http://\S+)`)

// StartServe runs cmd with args until ctx ends and returns once it has logged its URL. It
// fails t, with the log, if the command exits first.
func StartServe(t testing.TB, ctx context.Context, cmd *cobra.Command, args ...string) *Server {
	t.Helper()
	pr, pw := io.Pipe()
	cmd.SetOut(io.Discard)
	cmd.SetErr(pw)
	cmd.SetArgs(args)
	s := &Server{done: make(chan error, 1), logDone: make(chan struct{})}
	go func() { s.done <- cmd.ExecuteContext(ctx); pw.Close() }()
	urls := make(chan string, 1)
	go func() {
		defer close(s.logDone)
		sent := false
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.logs.WriteString(sc.Text() + "\n")
			if m := servingURL.FindStringSubmatch(sc.Text()); m != nil && !sent {
				urls <- m[1]
				sent = true
			}
		}
	}()
	select {
	case s.URL = <-urls:
	case err := <-s.done:
		<-s.logDone
		t.Fatalf("serve exited: %v\n%s", err, s.logs.String())
	}
	return s
}

// Wait waits for the command to return (end its context first) and for its log to close,
// and returns the command's error.
func (s *Server) Wait() error {
	err := <-s.done
	<-s.logDone
	return err
}

// Logs is everything the command logged; complete once Wait has returned.
func (s *Server) Logs() string { return s.logs.String() }
