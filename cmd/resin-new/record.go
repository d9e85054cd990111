package main

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// RecordFile holds the pristine render of a scaffold's scaffold-owned files: the "base" of
// the three-way merge `resin-new update` runs. It lives under .resin/ so the Go tool
// ignores it.
const RecordFile = ".resin/base.render"

// encodeRecord writes files as a sequence of "-- path N --" headers each followed by
// exactly N bytes and a newline, so contents round-trip byte for byte.
func encodeRecord(files []Rendered) []byte {
	var b bytes.Buffer
	b.WriteString("# resin-new: the last render of this scaffold's scaffold-owned files (do not edit)\n")
	sorted := append([]Rendered(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	for _, f := range sorted {
		if f.Owner != ScaffoldOwned {
			continue
		}
		fmt.Fprintf(&b, "-- %s %d --\n", f.Path, len(f.Content))
		b.Write(f.Content)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// decodeRecord parses what encodeRecord wrote.
func decodeRecord(data []byte) (map[string][]byte, error) {
	out := map[string][]byte{}
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
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s: bad entry header %q", RecordFile, hdr)
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil || n < 0 || nl+1+n+1 > len(rest) || rest[nl+1+n] != '\n' {
			return nil, fmt.Errorf("%s: entry %s: bad length", RecordFile, fields[0])
		}
		out[fields[0]] = append([]byte(nil), rest[nl+1:nl+1+n]...)
		rest = rest[nl+1+n+1:]
	}
	return out, nil
}
