//go:build unix

package glm5flash

import (
	"testing"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp/dptest"
)

// The dp process tests run dp ranks 1.. as children of the test binary (TestDPWorker),
// each serving its rank's forward (its KDA and MLA attention, its experts) to rank 0's
// engines; core/dist/dp/dptest holds the checks.

// dpModel is the tiny checkpoint (in dir; "" in a child, which reads it from its
// environment) as dptest's process tests open it.
func dpModel(dir string) dptest.Model {
	return dptest.Model{
		Worker: "TestDPWorker",
		Dir:    dir,
		Open: func(dir string, d int, data dist.Communicator) (dptest.Rank, error) {
			run, pool, err := OpenDPRank(dir, tinyOpts, Dispatch(d), data)
			if err != nil {
				return dptest.Rank{}, err
			}
			return dptest.Rank{Forward: run.DPForward, Pool: pool, Info: run.Info(), Groups: len(run.CacheGroups()), Vocab: run.Model.Config.VocabSize}, nil
		},
		Dispatches: []int{int(DispatchGather), int(DispatchAllToAll)},
	}
}

// TestDPWorker is dp rank r of a process test when run as a dptest.StartProcs child.
func TestDPWorker(t *testing.T) { dptest.ServeWorker(t, dpModel("")) }

// TestDPAttentionProcesses: DP-attention 2 × EP 2 with dp rank 1 a worker process, by
// either exchange and with graph-bucket padding, gives every request exactly the tokens
// one engine gives, rank 1 idle for several steps (dptest.CheckProcesses).
func TestDPAttentionProcesses(t *testing.T) {
	reqs := dpRequests(tinyTextModel(t).Config.VocabSize)
	dptest.CheckProcesses(t, dpModel(tinyDir(t)), reqs, dpWant(t, reqs))
}

// TestDPAttentionWorkerKilled: DP 3 × EP 3 with dp rank 1's worker SIGKILLed in its third
// step fails the step naming rank 1 as gone, and leaves no orphan
// (dptest.CheckWorkerKilled).
func TestDPAttentionWorkerKilled(t *testing.T) { dptest.CheckWorkerKilled(t, dpModel(tinyDir(t))) }
