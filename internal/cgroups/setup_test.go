package cgroups

import (
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
)

// TestSetup: a given root is used as given, the parents are set, and a
// refused parent is ErrParents (a settings error) and changes nothing.
func TestSetup(t *testing.T) {
	prev, err := SetParents(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = SetParents(prev) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	root, mode, err := Setup("/x/cgroup", []string{"/custom"}, log)
	if err != nil || root != "/x/cgroup" || mode != "given" || !slices.Equal(Parents(), []string{"/custom"}) {
		t.Fatalf("Setup = %q, %q, %v; parents %v", root, mode, err, Parents())
	}
	if _, _, err := Setup("/x/cgroup", []string{"relative"}, log); !errors.Is(err, ErrParents) {
		t.Fatalf("a relative parent: %v, want ErrParents", err)
	}
	if !slices.Equal(Parents(), []string{"/custom"}) {
		t.Fatalf("a refused setting changed the parents: %v", Parents())
	}
}
