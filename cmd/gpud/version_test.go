package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// `gpud version` says what was built, from what, when, with which Go, for
// which platform, in each -o format; the release's -ldflags stamp wins
// over Go's own VCS stamp.
func TestVersionOutputs(t *testing.T) {
	defer func(v, c, d string) { version, commit, buildDate = v, c, d }(version, commit, buildDate)
	version, commit, buildDate = "v0.3.0", "0123456789abcdef0123456789abcdef01234567", "2025-01-02T03:04:05Z"
	want := buildInfo{Version: "v0.3.0", Commit: commit, BuildDate: buildDate,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}

	run := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := dispatch(args, &out, &errOut); code != 0 {
			t.Fatalf("gpud %q: exit %d: %s", args, code, errOut.String())
		}
		return out.String()
	}
	var got buildInfo
	if err := json.Unmarshal([]byte(run("version", "-o", "json")), &got); err != nil || got != want {
		t.Errorf("version -o json: %+v (%v), want %+v", got, err, want)
	}
	got = buildInfo{}
	var y map[string]string
	if err := yaml.Unmarshal([]byte(run("version", "--output=yaml")), &y); err != nil ||
		y["version"] != want.Version || y["commit"] != want.Commit || y["buildDate"] != want.BuildDate ||
		y["goVersion"] != want.GoVersion || y["platform"] != want.Platform {
		t.Errorf("version -o yaml: %v (%v)", y, err)
	}
	text := run("version")
	for _, s := range []string{"gpud v0.3.0\n", want.Commit, want.BuildDate, want.GoVersion, want.Platform} {
		if !strings.Contains(text, s) {
			t.Errorf("version: no %q in\n%s", s, text)
		}
	}
	var out, errOut bytes.Buffer
	if code := dispatch([]string{"version", "-o", "xml"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "text, json or yaml") {
		t.Errorf("version -o xml: exit %d, %q", code, errOut.String())
	}
}
