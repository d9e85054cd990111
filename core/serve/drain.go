package serve

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// cutGrace is how long handlers whose requests the drain timeout aborted get to send
// their last event (an error event, then [DONE]) before the connections are closed.
const cutGrace = 2 * time.Second

// shutdown drains the server in three stages:
//
//  1. Draining: the listener still accepts, and every request that reaches the server,
//     on a new connection or a kept-alive one, is answered: /health with 503
//     "draining" (so load balancers take the server out), new API requests with 503,
//     each answer closing its connection, while the engine finishes the running
//     requests.
//  2. Once the engine is empty, or at Config.DrainTimeout, the listener closes (new
//     connections are refused), idle connections are closed, and the server waits for
//     the handlers to write their last bytes. At the timeout the requests still running
//     are aborted first: a stream gets an error event and [DONE] (never a chunk cut in
//     half), a plain request a 503.
//  3. Connections still open after that (cutGrace past the timeout) are closed.
func (s *Server) shutdown(hs *http.Server) error {
	s.draining.Store(true)
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	dctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	drainErr := s.eng.Drain(dctx)
	if drainErr != nil {
		s.eng.Close() // abort what is left: the handlers report it to their clients
		deadline = time.Now().Add(cutGrace)
	}
	sctx, scancel := context.WithDeadline(context.Background(), deadline)
	defer scancel()
	shutErr := hs.Shutdown(sctx)
	if shutErr != nil {
		hs.Close()
	}
	if drainErr != nil || shutErr != nil {
		err := drainErr
		if err == nil {
			err = shutErr
		}
		return fmt.Errorf("serve: drain did not finish within %s: %w", s.cfg.DrainTimeout, err)
	}
	return nil
}
