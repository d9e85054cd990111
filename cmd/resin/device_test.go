package main

import (
	"os"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cli"
)

// TestShowEmulatedGPUs: a layout's ranks on --device cuda-emu each get an emulated GPU,
// and more ranks than the emulator shows are refused naming the layout's flag (the
// refusal used to name RESIN_EMU_DEVICES, which the user never set).
func TestShowEmulatedGPUs(t *testing.T) {
	t.Setenv("RESIN_EMU_DEVICES", "")
	f := &runtimeFlags{}
	f.device.Device = cli.DeviceCUDAEmu
	if err := f.showEmulatedGPUs(maxEmulatedGPUs+1, "--cp 17"); err == nil || !strings.Contains(err.Error(), "--cp 17 with --device cuda-emu: 17 ranks") {
		t.Fatalf("17 ranks: %v", err)
	}
	if err := f.showEmulatedGPUs(3, "--ep 3"); err != nil || os.Getenv("RESIN_EMU_DEVICES") != "3" {
		t.Fatalf("3 ranks: %v, RESIN_EMU_DEVICES=%q", err, os.Getenv("RESIN_EMU_DEVICES"))
	}
	if err := f.showEmulatedGPUs(maxEmulatedGPUs+1, "--cp 17"); err != nil {
		t.Fatalf("with RESIN_EMU_DEVICES set: %v", err) // the user's setting stands
	}
	if got := layoutSpelling(2, 1, 4); got != "--tp 2 --cp 4" {
		t.Fatalf("layoutSpelling(2, 1, 4) = %q", got)
	}
}
