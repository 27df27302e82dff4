package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/gpud/gpud/internal/status"
)

// commit and buildDate are set at build time with -ldflags "-X
// main.commit=... -X main.buildDate=..." (scripts/release.sh, make build):
// the commit's hash and its committer date, so that the same commit gives
// the same binary. Unset, Go's own VCS stamp (a plain `go build` in a
// checkout) is used.
var (
	commit    = ""
	buildDate = ""
)

// buildInfo is what `gpud version` prints.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// currentBuild describes this binary.
func currentBuild() buildInfo {
	b := buildInfo{Version: version, Commit: commit, BuildDate: buildDate,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info, ok := debug.ReadBuildInfo(); ok {
		dirty := false
		for _, s := range info.Settings {
			switch {
			case s.Key == "vcs.revision" && b.Commit == "":
				b.Commit = s.Value
			case s.Key == "vcs.time" && b.BuildDate == "":
				b.BuildDate = s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				dirty = true
			}
		}
		if dirty && commit == "" && b.Commit != "" {
			b.Commit += "-dirty"
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.BuildDate == "" {
		b.BuildDate = "unknown"
	}
	return b
}

func newVersionCmd() *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "version",
		Short: "print the version, commit, build date, Go version and platform",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			b := currentBuild()
			return status.WriteRecord(c.OutOrStdout(), b, output, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "gpud %s\n  commit:     %s\n  build date: %s\n  go:         %s\n  platform:   %s\n",
					b.Version, b.Commit, b.BuildDate, b.GoVersion, b.Platform)
				return err
			})
		},
	}
	outputFlag(c, &output, "text", status.RecordFormats)
	return c
}
