package config

import (
	"errors"
	"strings"
	"testing"
)

// FuzzConfig feeds arbitrary bytes as the settings file (and as an
// environment value): Load never panics, and either fails with one line or
// yields settings whose every value came from a source it names.
//
//	go test -fuzz FuzzConfig ./internal/config/
func FuzzConfig(f *testing.F) {
	for _, seed := range []string{
		"version: v1\n",
		"version: v1\nidle-after: 5m\ndefault-priority: low\nenforce: false\nmonitoring: true\n",
		"version: v2\n",
		"version: v1\nidle_after: 5m\n",
		"version: v1\nidle-after: [1m]\n",
		"version: v1\nidle-after: &a 1m\npreempt-grace: *a\n",
		"version: v1\n<<: {idle-after: 1m}\n",
		"version: v1\n---\nversion: v1\n",
		"{version: v1, idle-after: 2m}",
		"version: !!binary djE=\n",
		"a: &a [*a]\n",
		"version: v1\nidle-after:\n",
		"\xff\xfe",
		"version: v1\nstate-file: \"\\u0000\"\n",
		"? version\n: v1\n",
		"",
	} {
		f.Add([]byte(seed), "1m")
	}
	f.Fuzz(func(t *testing.T, data []byte, envValue string) {
		fs, v := newFlags()
		src := fake(map[string]string{"GPUD_PREEMPT_GRACE": envValue}, map[string]string{"/f.yaml": string(data)})
		s, err := Load(fs, []string{"--config", "/f.yaml"}, src)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("error is not one line: %q", err)
			}
			var ce *Error
			if errors.As(err, &ce) && ce.Origin == "" {
				t.Fatalf("error without an origin: %q", err)
			}
			return
		}
		if s.File != "/f.yaml" {
			t.Fatalf("File = %q", s.File)
		}
		if got := s.Origin("preempt-grace"); got != "env GPUD_PREEMPT_GRACE" {
			t.Fatalf("preempt-grace from %q, want the environment", got)
		}
		if v.defPrio != "unmanaged" && v.defPrio != "low" && v.defPrio != "high" {
			t.Fatalf("default-priority %q accepted", v.defPrio)
		}
		for name := range s.Values() {
			o := s.Origin(name)
			if o != "default" && !strings.HasPrefix(o, "file /f.yaml:") && !strings.HasPrefix(o, "env ") && !strings.HasPrefix(o, "flag ") {
				t.Fatalf("%s from %q", name, o)
			}
		}
	})
}
