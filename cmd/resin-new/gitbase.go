package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"strings"
	"testing/fstest"

	"github.com/BurntSushi/toml"
)

// baseFromGit finds, in the checkout's git history, the newest commit whose
// templates/NAME/manifest.toml has the given version, and returns that commit's base.
func baseFromGit(coreDir, name, version string) (*Base, string, error) {
	git := func(args ...string) ([]byte, error) {
		cmd := exec.Command("git", append([]string{"-C", coreDir}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	dir := path.Join("templates", name)
	log, err := git("log", "--format=%H", "--", dir+"/manifest.toml")
	if err != nil {
		return nil, "", err
	}
	for _, c := range strings.Fields(string(log)) {
		data, err := git("show", c+":"+dir+"/manifest.toml")
		if err != nil {
			continue
		}
		var m Manifest
		if _, err := toml.Decode(string(data), &m); err != nil || m.Version != version {
			continue
		}
		ls, err := git("ls-tree", "-r", "--name-only", c, "--", dir+"/")
		if err != nil {
			return nil, "", err
		}
		tfs := fstest.MapFS{}
		for _, p := range strings.Split(strings.TrimSpace(string(ls)), "\n") {
			data, err := git("show", c+":"+p)
			if err != nil {
				return nil, "", err
			}
			tfs[strings.TrimPrefix(p, "templates/")] = &fstest.MapFile{Data: data}
		}
		bases, err := loadBases(tfs)
		if err != nil {
			return nil, "", fmt.Errorf("template %s v%s at %s: %w", name, version, c[:12], err)
		}
		b, err := findBase(bases, name)
		return b, c[:12], err
	}
	return nil, "", fmt.Errorf("no commit of %s has template %s at version %s", coreDir, name, version)
}
