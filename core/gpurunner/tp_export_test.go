package gpurunner

import "github.com/resin-llm/resin/core/engine"

// DecodePlanForTest is decodePlan for the external tests (tp_test.go).
func DecodePlanForTest(n, ctx, pageTokens int) *engine.BatchPlan {
	return decodePlan(n, ctx, pageTokens)
}
