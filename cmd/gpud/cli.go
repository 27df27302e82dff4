package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/status"
)

// outputFlag defines -o (long --output; --o, Go's flag package's spelling
// of the old flag, still works) with its values for completion.
func outputFlag(c *cobra.Command, p *string, def string, formats []string) {
	c.Flags().StringVarP(p, "output", "o", def, "output format: "+joinOr(formats))
	c.Flags().SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "o" {
			name = "output"
		}
		return pflag.NormalizedName(name)
	})
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
}

func joinOr(w []string) string {
	s := ""
	for i, x := range w {
		switch {
		case i == 0:
		case i == len(w)-1:
			s += " or "
		default:
			s += ", "
		}
		s += x
	}
	return s
}

func checkFormat(cmd, got string, formats []string) error {
	for _, f := range formats {
		if got == f {
			return nil
		}
	}
	return usagef("%s: -o %q: want %s", cmd, got, joinOr(formats))
}

// isTerminal: --watch clears the screen only there; a pipe or a file gets
// plain frames.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func newStatusCmd() *cobra.Command {
	var stateFile, output string
	var watch time.Duration
	c := &cobra.Command{
		Use:   "status",
		Short: "show GPUs, holders, loans and the last preemptions",
		Long: `Shows the state file: GPUs, their holders (pods as namespace/name, Docker
containers by name), loans and the last preemptions. -o table fits 80
columns; -o wide has every column whole; -o json is the state file as it is
and -o yaml the same document in YAML. --watch refreshes until interrupted:
on a terminal in place, elsewhere as one frame after another (no escape
codes).`,
		Args: cobra.NoArgs,
		RunE: ran(func(c *cobra.Command, _ []string) error {
			if err := checkFormat("status", output, status.Formats); err != nil {
				return err
			}
			if watch < 0 {
				return usagef("status: --watch must not be negative")
			}
			out := c.OutOrStdout()
			show := func(w io.Writer) error {
				f, err := occupancy.ReadStateFile(stateFile)
				if err != nil {
					return fmt.Errorf("status: %w (is gpud running?)", err)
				}
				return status.Write(w, f, output, time.Now())
			}
			if watch == 0 {
				return show(out)
			}
			// Until interrupted; a state file briefly missing (gpud
			// restarting) is shown and the watch goes on.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			status.Watch(ctx, status.WatchOptions{Out: out, Err: c.ErrOrStderr(), Terminal: isTerminal(out),
				Every: watch, Format: output}, show)
			return nil
		}),
	}
	c.Flags().StringVar(&stateFile, "state-file", "/run/gpud/state.json", "state file to read")
	outputFlag(c, &output, "table", status.Formats)
	c.Flags().DurationVar(&watch, "watch", 0, "refresh every interval (e.g. 1s) until interrupted")
	return c
}

func newExplainCmd() *cobra.Command {
	var socket, output string
	var pid int
	c := &cobra.Command{
		Use:   "explain --pid N",
		Short: "which rule applies to a process now",
		Args:  cobra.NoArgs,
		RunE: ran(func(c *cobra.Command, _ []string) error {
			if pid <= 0 {
				return usagef("explain: --pid N is required (a positive PID)")
			}
			if err := checkFormat("explain", output, status.ExplainFormats); err != nil {
				return err
			}
			e, err := v1.NewClient(socket).Explain(context.Background(), pid)
			if err != nil {
				return fmt.Errorf("explain: %w", err)
			}
			return status.WriteExplain(c.OutOrStdout(), e, output)
		}),
	}
	c.Flags().StringVar(&socket, "control-socket", v1.DefaultSocket, "control socket of the running daemon")
	c.Flags().IntVar(&pid, "pid", 0, "the process to explain (as seen from gpud's PID namespace)")
	outputFlag(c, &output, "text", status.ExplainFormats)
	return c
}

func newMonitorCmd() *cobra.Command {
	var socket string
	c := &cobra.Command{
		Use:       "monitor on|off",
		Short:     "switch kernel monitoring on a running daemon",
		ValidArgs: []string{"on\tobserve GPU opens and apply the rules", "off\tfreeze the ledger; the gate allows every open"},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("monitor: want on or off")
			}
			if args[0] != "on" && args[0] != "off" {
				return usagef("monitor: %q: want on or off", args[0])
			}
			return nil
		},
		RunE: ran(func(c *cobra.Command, args []string) error {
			line, err := v1.NewClient(socket).SetMonitoring(context.Background(), args[0] == "on")
			if err != nil {
				return fmt.Errorf("monitor: %w", err)
			}
			fmt.Fprint(c.OutOrStdout(), line)
			return nil
		}),
	}
	c.Flags().StringVar(&socket, "control-socket", v1.DefaultSocket, "control socket of the running daemon")
	return c
}
