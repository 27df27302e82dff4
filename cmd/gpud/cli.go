package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/status"
)

func cmdStatus(args []string) error {
	fs := newFlagSet("status")
	stateFile := fs.String("state-file", "/run/gpud/state.json", "state file to read")
	output := fs.String("o", "table", "output format: table|json")
	watch := fs.Duration("watch", 0, "refresh every interval (e.g. 1s) until interrupted")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usagef("status: -o %q: want table or json", *output)
	}
	if *watch < 0 {
		return usagef("status: --watch must not be negative")
	}
	show := func() error {
		f, err := occupancy.ReadStateFile(*stateFile)
		if err != nil {
			return fmt.Errorf("status: %w (is gpud running?)", err)
		}
		if *output == "json" {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(f)
		}
		return status.Render(os.Stdout, f, time.Now())
	}
	if *watch == 0 {
		return show()
	}
	// Until interrupted; a state file briefly missing (gpud restarting)
	// is shown and the watch goes on.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t := time.NewTicker(*watch)
	defer t.Stop()
	for {
		if *output == "table" {
			fmt.Print("\033[H\033[2J") // home, clear
		}
		if err := show(); err != nil {
			fmt.Fprintln(os.Stderr, "gpud:", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func cmdExplain(args []string) error {
	fs := newFlagSet("explain")
	socket := fs.String("control-socket", v1.DefaultSocket, "control socket of the running daemon")
	pid := fs.Int("pid", 0, "the process to explain (as seen from gpud's PID namespace)")
	output := fs.String("o", "text", "output format: text|json")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *pid <= 0 {
		return usagef("explain: --pid N is required (a positive PID)")
	}
	if *output != "text" && *output != "json" {
		return usagef("explain: -o %q: want text or json", *output)
	}
	e, err := v1.NewClient(*socket).Explain(context.Background(), *pid)
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	if *output == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(e)
	}
	return status.RenderExplain(os.Stdout, e)
}

func cmdMonitor(args []string) error {
	fs := newFlagSet("monitor")
	socket := fs.String("control-socket", v1.DefaultSocket, "control socket of the running daemon")
	if len(args) == 0 {
		return usagef("monitor: want on or off")
	}
	what := args[len(args)-1]
	if err := parse(fs, args[:len(args)-1]); err != nil {
		return err
	}
	var on bool
	switch what {
	case "on":
		on = true
	case "off":
	default:
		return usagef("monitor: %q: want on or off", what)
	}
	line, err := v1.NewClient(*socket).SetMonitoring(context.Background(), on)
	if err != nil {
		return fmt.Errorf("monitor: %w", err)
	}
	fmt.Print(line)
	return nil
}
