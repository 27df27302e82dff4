package httpserve

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestRunnerServesUntilCtxEnds(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Off: returns at once, whatever ctx.
	done := make(chan struct{})
	go func() {
		Runner("", http.NotFoundHandler(), Limits{}, "", "off", log)(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an endpoint that is off still runs")
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		Runner(addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), Limits{}, "", "test", log)(ctx)
		close(done)
	}()
	var resp *http.Response
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if resp, err = http.Get("http://" + addr + "/"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("not served: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("body %q", body)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("still serving after ctx ended")
	}
}
