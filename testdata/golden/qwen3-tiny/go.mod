module github.com/acme/qwen3-tiny

go 1.26.0

require github.com/resin-llm/resin v0.0.0

replace github.com/resin-llm/resin => ../../..
