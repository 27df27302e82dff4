package status

import (
	"fmt"
	"io"
	"strings"

	v1 "github.com/gpud/gpud/api/v1"
)

// renderKernelMaps warns of the kernel maps that are nearly full: how full
// each is, and how gpud fails safe when it is (wrapped, not cut: the
// table's lines are cut at Width).
func renderKernelMaps(w io.Writer, maps []v1.StateKernelMap) {
	for _, m := range maps {
		pct := 0
		if m.Capacity > 0 {
			pct = int(int64(m.Entries) * 100 / int64(m.Capacity))
		}
		fmt.Fprintf(w, "KERNEL MAP NEARLY FULL  %s %d of %d entries (%d%%)\n", trunc(printable(m.Name), 20), m.Entries, m.Capacity, pct)
		if m.Full != "" {
			for _, l := range wrap("when full: "+printable(m.Full), Width-2) {
				fmt.Fprintf(w, "  %s\n", l)
			}
		}
	}
}

// wrap breaks s into lines of at most n columns at spaces (a word longer
// than n is left for the table's cut).
func wrap(s string, n int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len([]rune(line))+1+len([]rune(word)) <= n:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
