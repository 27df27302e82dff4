// Package logging routes the logs of the libraries gpud uses, client-go
// (klog) and gRPC (grpclog), into gpud's slog handler: `gpud run` writes
// one stream of JSON lines with gpud's field names, not the libraries' own
// text formats in between.
package logging

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
)

// Field names every routed line carries or uses.
const (
	// KeyComponent names the library a line came from: ComponentKlog or
	// ComponentGRPC.
	KeyComponent = "component"
	// KeyError is gpud's name for an error; klog's structured errors
	// (logr's "err") are renamed to it.
	KeyError = "error"
)

// The values of KeyComponent.
const (
	ComponentKlog = "client-go"
	ComponentGRPC = "grpc"
)

// Route sends klog's and grpclog's output to log's handler. Call it once,
// before any client-go or gRPC code runs: neither library's setter may
// race with its logging.
func Route(log *slog.Logger) {
	h := log.Handler()
	klog.SetSlogLogger(slog.New(renameErr{h}).With(KeyComponent, ComponentKlog))
	grpclog.SetLoggerV2(&grpcLogger{log: slog.New(h).With(KeyComponent, ComponentGRPC)})
}

// renameErr renames logr's "err" attribute (klog.ErrorS) to KeyError.
type renameErr struct{ slog.Handler }

func (r renameErr) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, rec.Message, rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(rename(a))
		return true
	})
	return r.Handler.Handle(ctx, out)
}

func (r renameErr) WithAttrs(attrs []slog.Attr) slog.Handler {
	renamed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		renamed[i] = rename(a)
	}
	return renameErr{r.Handler.WithAttrs(renamed)}
}

func (r renameErr) WithGroup(name string) slog.Handler { return renameErr{r.Handler.WithGroup(name)} }

func rename(a slog.Attr) slog.Attr {
	if a.Key == "err" {
		a.Key = KeyError
	}
	return a
}

// grpcLogger is grpclog.LoggerV2 over slog. gRPC's info lines (connection
// state changes, chatty) are debug lines here: its own default logger
// shows only errors.
type grpcLogger struct{ log *slog.Logger }

func (g *grpcLogger) emit(level slog.Level, msg string) {
	g.log.Log(context.Background(), level, strings.TrimSuffix(msg, "\n"))
}

func (g *grpcLogger) Info(args ...any)   { g.emit(slog.LevelDebug, fmt.Sprint(args...)) }
func (g *grpcLogger) Infoln(args ...any) { g.emit(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g *grpcLogger) Infof(format string, args ...any) {
	g.emit(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Warning(args ...any)   { g.emit(slog.LevelWarn, fmt.Sprint(args...)) }
func (g *grpcLogger) Warningln(args ...any) { g.emit(slog.LevelWarn, fmt.Sprintln(args...)) }
func (g *grpcLogger) Warningf(format string, args ...any) {
	g.emit(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g *grpcLogger) Error(args ...any)   { g.emit(slog.LevelError, fmt.Sprint(args...)) }
func (g *grpcLogger) Errorln(args ...any) { g.emit(slog.LevelError, fmt.Sprintln(args...)) }
func (g *grpcLogger) Errorf(format string, args ...any) {
	g.emit(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal* log and exit, as grpclog.LoggerV2 requires.
func (g *grpcLogger) Fatal(args ...any)   { g.emit(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (g *grpcLogger) Fatalln(args ...any) { g.emit(slog.LevelError, fmt.Sprintln(args...)); os.Exit(1) }
func (g *grpcLogger) Fatalf(format string, args ...any) {
	g.emit(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether gRPC's verbose level l is on: never above 0 (gRPC's
// own default, without GRPC_GO_LOG_VERBOSITY_LEVEL).
func (g *grpcLogger) V(l int) bool { return l <= 0 }
