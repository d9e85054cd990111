package main

import (
	"fmt"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// dpAttentionMoEModels are the MoE models whose forwards read the plan's dp step: under
// --dp N --dp-attention each rank attends its own requests and the MoE layers run expert
// parallel over the N ranks (the ep group is the dp group), exchanging by --ep-dispatch.
var dpAttentionMoEModels = map[string]bool{deepseekv4flash.Name: true, glm5flash.Name: true}

// openDPAttentionMoE opens the dp ranks of MoE model name from dir for --dp-attention,
// each with a pool of cacheBytes, its MoE exchanges on data, under one dp.Group (ctl its
// clock): rank 0's runner and pool, and the others'. With drafts above 0
// (--num-speculative-tokens) every rank drafts that many tokens per step with its MTP
// head, the head's routed experts split over the ranks too, an idle rank running its
// draft step's exchanges with no rows (the models' DPDraft).
func openDPAttentionMoE(name, dir string, cacheBytes int64, dispatch string, drafts int, ctl, data []dist.Communicator) (engine.Runner, *kvslab.Pool, *cli.DPRanks, error) {
	d, err := dispatchOf(dispatch)
	if err != nil {
		return nil, nil, nil, err
	}
	n := len(data)
	ranks := make([]dp.Rank, n)
	infos := make([]engine.RunnerInfo, n)
	var pools []*kvslab.Pool
	switch name {
	case deepseekv4flash.Name:
		var runners []*deepseekv4flash.Runner
		runners, pools, err = deepseekv4flash.OpenDPRanks(dir, deepseekv4flash.Options{Drafts: drafts}, deepseekv4flash.Dispatch(d), data, cacheBytes)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--dp %d --dp-attention: %w", n, err)
		}
		for r, run := range runners {
			ranks[r] = dp.Rank{Forward: run.DPForward, CacheGroups: len(run.CacheGroups()), Ctl: ctl[r], Data: data[r]}
			if drafts > 0 {
				ranks[r].Draft, ranks[r].MaxDrafts = run.DPDraft, drafts
			}
			infos[r] = run.Info()
		}
	case glm5flash.Name:
		var runners []*glm5flash.TextRunner
		runners, pools, err = glm5flash.OpenDPRanks(dir, glm5flash.RankOptions{CacheBytes: cacheBytes, Drafts: drafts}, glm5flash.Dispatch(d), data)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--dp %d --dp-attention: %w", n, err)
		}
		for r, run := range runners {
			ranks[r] = dp.Rank{Forward: run.DPForward, CacheGroups: len(run.CacheGroups()), Ctl: ctl[r], Data: data[r]}
			if drafts > 0 {
				ranks[r].Draft, ranks[r].MaxDrafts = run.DPDraft, drafts
			}
			infos[r] = run.Info()
		}
	default:
		return nil, nil, nil, fmt.Errorf("--dp-attention: model %s's forward does not read the plan's dp step", name)
	}
	group, err := dp.NewGroup(ranks, dp.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	runners := make([]engine.Runner, n)
	for r := range n {
		runners[r] = cpurunner.New(infos[r], group.Runner(r)) // a cpurunner.Drafter when the ranks draft
	}
	return runners[0], pools[0], &cli.DPRanks{Runners: runners[1:], Pools: pools[1:], Group: group}, nil
}
