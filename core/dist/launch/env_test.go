package launch_test

import (
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/dist/launch"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestNodeFromEnv: LeaderWorkerSet's and torchrun's variables give the node's layout
// (LWS first when both are set), none gives none, and malformed ones are errors naming
// the variable.
func TestNodeFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  func(string) string
		want launch.Node
	}{
		{"lws", env("LWS_LEADER_ADDRESS", "resin-0.resin.default", "LWS_GROUP_SIZE", "4", "LWS_WORKER_INDEX", "2"),
			launch.Node{InitAddr: "resin-0.resin.default:29500", NNodes: 4, NodeRank: 2, From: "leaderworkerset"}},
		{"lws port", env("LWS_LEADER_ADDRESS", "10.0.0.7", "LWS_GROUP_SIZE", "2", "LWS_WORKER_INDEX", "0", "RESIN_DIST_PORT", "5000", "MASTER_PORT", "6000"),
			launch.Node{InitAddr: "10.0.0.7:5000", NNodes: 2, NodeRank: 0, From: "leaderworkerset"}},
		{"lws over torchrun", env("LWS_LEADER_ADDRESS", "lead", "LWS_GROUP_SIZE", "2", "LWS_WORKER_INDEX", "1", "MASTER_ADDR", "other", "WORLD_SIZE", "8", "RANK", "5"),
			launch.Node{InitAddr: "lead:29500", NNodes: 2, NodeRank: 1, From: "leaderworkerset"}},
		{"torchrun", env("MASTER_ADDR", "node0", "MASTER_PORT", "29400", "WORLD_SIZE", "2", "RANK", "1"),
			launch.Node{InitAddr: "node0:29400", NNodes: 2, NodeRank: 1, From: "torchrun"}},
		{"torchrun, 4 processes a machine", env("MASTER_ADDR", "node0", "WORLD_SIZE", "8", "RANK", "6", "LOCAL_RANK", "2"),
			launch.Node{InitAddr: "node0:29500", NNodes: 8, NodeRank: 6, LocalRank: 2, From: "torchrun"}},
		{"ipv6", env("MASTER_ADDR", "fd00::1", "WORLD_SIZE", "2", "RANK", "0"),
			launch.Node{InitAddr: "[fd00::1]:29500", NNodes: 2, NodeRank: 0, From: "torchrun"}},
	} {
		got, ok, err := launch.NodeFromEnv(c.env)
		if err != nil || !ok || got != c.want {
			t.Errorf("%s: %+v %v %v, want %+v", c.name, got, ok, err, c.want)
		}
	}
	if _, ok, err := launch.NodeFromEnv(env("MASTER_PORT", "1")); ok || err != nil {
		t.Errorf("no layout: ok %v, %v", ok, err)
	}
	for _, c := range []struct {
		env  func(string) string
		want string
	}{
		{env("LWS_LEADER_ADDRESS", "lead", "LWS_GROUP_SIZE", "two", "LWS_WORKER_INDEX", "0"), `LWS_GROUP_SIZE="two"`},
		{env("LWS_LEADER_ADDRESS", "lead", "LWS_GROUP_SIZE", "2"), `LWS_WORKER_INDEX=""`},
		{env("LWS_LEADER_ADDRESS", "lead", "LWS_GROUP_SIZE", "2", "LWS_WORKER_INDEX", "2"), "node rank 2 outside [0, 2) (leaderworkerset)"},
		{env("MASTER_ADDR", "a", "WORLD_SIZE", "2", "RANK", "0", "MASTER_PORT", "http"), `port "http"`},
		{env("MASTER_ADDR", "a", "WORLD_SIZE", "0", "RANK", "0"), "0 nodes (torchrun)"},
		{env("MASTER_ADDR", "a", "WORLD_SIZE", "2", "RANK", "0", "LOCAL_RANK", "x"), `LOCAL_RANK="x"`},
		{env("MASTER_ADDR", "a", "WORLD_SIZE", "2", "RANK", "0", "LOCAL_RANK", "-1"), "LOCAL_RANK=-1 is negative"},
	} {
		if _, ok, err := launch.NodeFromEnv(c.env); !ok || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ok %v, %v, want an error with %q", ok, err, c.want)
		}
	}
}
