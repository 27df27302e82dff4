package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
)

// TestRoute: client-go's klog lines (structured, printf-style, errors) and
// gRPC's grpclog lines come out of gpud's JSON handler, one JSON object a
// line with gpud's field names (msg, level, component, error), and nothing
// reaches stderr in the libraries' own formats.
func TestRoute(t *testing.T) {
	var buf bytes.Buffer
	Route(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))

	// Whatever the libraries would write on their own goes to stderr.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	klog.InfoS("watch started", "resource", "pods")
	klog.Infof("reflector %s", "pods")
	klog.ErrorS(errors.New("connection refused"), "failed to list pods", "node", "n1")
	klog.Warning("throttled")
	klog.V(5).Info("verbose: not shown") // klog's -v stays 0
	klog.Flush()
	grpclog.Warningf("[transport] closing: %v", "EOF")
	grpclog.Component("core").Errorf("subchannel %d failed", 3)
	grpclog.Info("channel state READY")
	os.Stderr = stderr
	w.Close()
	leaked, _ := io.ReadAll(r)
	if len(leaked) > 0 {
		t.Errorf("written to stderr, outside the handler: %q", leaked)
	}

	type line struct {
		Level, Msg, Component, Error, Resource, Node string
	}
	var got []line
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var x line
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatalf("not a JSON line: %q (%v)", l, err)
		}
		got = append(got, x)
	}
	want := []line{
		{Level: "INFO", Msg: "watch started", Component: ComponentKlog, Resource: "pods"},
		{Level: "INFO", Msg: "reflector pods", Component: ComponentKlog},
		{Level: "ERROR", Msg: "failed to list pods", Component: ComponentKlog, Error: "connection refused", Node: "n1"},
		{Level: "INFO", Msg: "throttled", Component: ComponentKlog}, // klogr has no warning level
		{Level: "WARN", Msg: "[transport] closing: EOF", Component: ComponentGRPC},
		{Level: "ERROR", Msg: "[core] subchannel 3 failed", Component: ComponentGRPC},
		{Level: "DEBUG", Msg: "channel state READY", Component: ComponentGRPC},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(got), len(want), buf.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if strings.Contains(buf.String(), `"err"`) {
		t.Errorf("logr's err key left:\n%s", buf.String())
	}
}
