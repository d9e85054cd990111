//go:build !unix

package main

import "os/exec"

// killGroupOnCancel leaves cmd as it is: without process groups only the item's shell is
// killed on cancellation (WaitDelay then stops waiting for its children's output).
func killGroupOnCancel(cmd *exec.Cmd) {}
