package cli

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/wire"
)

// TestRemoteDefaultPoolOfSmallSlabs: --runner-cache-bytes left at its default builds the
// engine's default pool, cut to the slabs a page id addresses, for a runner whose slabs
// are 4 KiB or less (256 MiB of them is more than 65,535 slabs, which an explicit size
// still gets refused for).
func TestRemoteDefaultPoolOfSmallSlabs(t *testing.T) {
	tr, err := enginetest.New(enginetest.Config{VocabSize: 100, Pages: 64})
	if err != nil {
		t.Fatal(err)
	}
	z, err := kvslab.Size(kvslab.Config{Groups: tr.Info().CacheGroups}, engine.DefaultCacheBytes, 1)
	if err != nil {
		t.Fatal(err)
	}
	if z.SlabBytes*kvslab.MaxSlabs >= engine.DefaultCacheBytes {
		t.Fatalf("the test runner's slabs are %d bytes: the case needs slabs small enough that 256 MiB overflows the page ids", z.SlabBytes)
	}
	path := filepath.Join(t.TempDir(), "runner.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		wire.Serve(context.Background(), c, c, tr, wire.ServeOptions{})
	}()
	var f RemoteFlags
	cmd := &cobra.Command{Use: "x"}
	f.Register(cmd)
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	r, pool, err := f.Open("unix:"+path, t.Output())
	if err != nil {
		t.Fatalf("the default --runner-cache-bytes: %v", err)
	}
	defer r.(*wire.Remote).Close()
	if s := pool.Stats(); s.Slabs != kvslab.MaxSlabs {
		t.Errorf("pool of %d slabs, want the %d a page id addresses", s.Slabs, kvslab.MaxSlabs)
	}
}
