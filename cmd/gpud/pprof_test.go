package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestServePprof: the profiles are served where asked and nothing else
// is (not the metrics, not the default mux), and the server stops with
// gpud.
func TestServePprof(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if err := servePprof(ctx, addr, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		r, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	if code, body := get("/debug/pprof/heap?debug=1"); code != 200 || !strings.Contains(body, "HeapAlloc") {
		t.Fatalf("heap profile: %d %.100s", code, body)
	}
	if code, _ := get("/metrics"); code != 404 {
		t.Errorf("/metrics on the pprof address: %d, want 404", code)
	}
	cancel()
	for i := 0; i < 100; i++ {
		if code, _ := get("/debug/pprof/"); code == 0 {
			return
		}
	}
	t.Error("pprof endpoint still serving after gpud stopped")
}
