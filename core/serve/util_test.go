package serve

import (
	"io"
	"net/http"
	"testing"

	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/tokenizer"
)

func chatOpts() tokenizer.ChatOptions { return tokenizer.ChatOptions{AddGenerationPrompt: true} }

func smallRunner() enginetest.Config { return enginetest.Config{MaxContext: 256} }

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func ioPipe() (*io.PipeReader, *io.PipeWriter) { return io.Pipe() }
