package main

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// RecordFile holds the pristine render of a scaffold's scaffold-owned files: the "base" of
// the three-way merge `resin-new update` runs. It lives under .resin/ so the Go tool
// ignores it.
const RecordFile = ".resin/base.render"

// recordEntry is one file of the recorded render.
type recordEntry struct {
	content []byte
	owner   Owner
}

// encodeRecord writes files as a sequence of "-- path N --" headers (scaffold-owned) or
// "-- path N user --" headers (user-owned), each followed by exactly N bytes and a newline,
// so contents round-trip byte for byte. User-owned files are recorded so that update can
// tell a template change to them (a patch) and a file the user deleted (left deleted).
func encodeRecord(files []Rendered) []byte {
	var b bytes.Buffer
	b.WriteString("# resin-new: the last render of this scaffold's files (do not edit)\n")
	sorted := append([]Rendered(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	for _, f := range sorted {
		tag := ""
		if f.Owner == UserOwned {
			tag = " user"
		}
		fmt.Fprintf(&b, "-- %s %d%s --\n", f.Path, len(f.Content), tag)
		b.Write(f.Content)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// decodeRecord parses what encodeRecord wrote.
func decodeRecord(data []byte) (map[string]recordEntry, error) {
	out := map[string]recordEntry{}
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 || !bytes.HasPrefix(data, []byte("# resin-new")) {
		return nil, fmt.Errorf("%s: missing header", RecordFile)
	}
	rest := data[nl+1:]
	for len(rest) > 0 {
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			return nil, fmt.Errorf("%s: truncated entry header", RecordFile)
		}
		hdr := string(rest[:nl])
		if !strings.HasPrefix(hdr, "-- ") || !strings.HasSuffix(hdr, " --") {
			return nil, fmt.Errorf("%s: bad entry header %q", RecordFile, hdr)
		}
		fields := strings.Fields(strings.TrimSuffix(strings.TrimPrefix(hdr, "-- "), " --"))
		owner := ScaffoldOwned
		if len(fields) == 3 && fields[2] == "user" {
			owner, fields = UserOwned, fields[:2]
		}
		if len(fields) != 2 || !validRel(fields[0]) {
			return nil, fmt.Errorf("%s: bad entry header %q", RecordFile, hdr)
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil || n < 0 || nl+1+n+1 > len(rest) || rest[nl+1+n] != '\n' {
			return nil, fmt.Errorf("%s: entry %s: bad length", RecordFile, fields[0])
		}
		out[fields[0]] = recordEntry{content: append([]byte(nil), rest[nl+1:nl+1+n]...), owner: owner}
		rest = rest[nl+1+n+1:]
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
