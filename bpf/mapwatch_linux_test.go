package bpf

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestMapWatchWarnsOnceAndClears: a map reaching MapNearlyFull is warned
// of once and shown (with how gpud fails safe), its return below is said,
// and readings closer than MapsEvery read nothing.
func TestMapWatchWarnsOnceAndClears(t *testing.T) {
	var logs bytes.Buffer
	entries, reads, changes := 0, 0, 0
	w := &MapWatch{
		Read: func() ([]MapUsage, error) {
			reads++
			return []MapUsage{{Name: MapCgroupPrio, Entries: entries, Capacity: 100}}, nil
		},
		Log:     slog.New(slog.NewTextHandler(&logs, nil)),
		Changed: func() { changes++ },
	}
	t0 := time.Unix(1000, 0)
	entries = 79
	w.Sample(t0)
	if len(w.NearlyFull()) != 0 || changes != 0 {
		t.Fatalf("79 of 100: nearly full %v, changes %d", w.NearlyFull(), changes)
	}
	entries = 80
	w.Sample(t0.Add(time.Second))
	if reads != 1 {
		t.Fatalf("read %d times within MapsEvery, want 1", reads)
	}
	w.Sample(t0.Add(MapsEvery))
	w.Sample(t0.Add(2 * MapsEvery))
	nf := w.NearlyFull()
	if len(nf) != 1 || nf[0].Name != MapCgroupPrio || nf[0].Entries != 80 || nf[0].Full == "" {
		t.Fatalf("80 of 100: nearly full %+v", nf)
	}
	if changes != 1 || strings.Count(logs.String(), "kernel map nearly full") != 1 {
		t.Fatalf("want one change and one warning, got %d and logs %s", changes, logs.String())
	}
	entries = 10
	w.Sample(t0.Add(3 * MapsEvery))
	if len(w.NearlyFull()) != 0 || changes != 2 || !strings.Contains(logs.String(), "no longer nearly full") {
		t.Fatalf("back to 10 of 100: nearly full %v, changes %d, logs %s", w.NearlyFull(), changes, logs.String())
	}
	if u := w.Usage(); len(u) != 1 || u[0].Entries != 10 {
		t.Fatalf("usage %+v", u)
	}
}
