package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/status"
)

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
		Args: noArgs,
		RunE: ran(func(c *cobra.Command, _ []string) error {
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
	c.Flags().StringVar(&stateFile, "state-file", config.Defaults().StateFile, "state file to read (gpud run's default)")
	outputFlag(c, &output, "table", listOutputs)
	c.Flags().DurationVar(&watch, "watch", 0, "refresh every interval (e.g. 1s) until interrupted")
	return c
}

func newExplainCmd() *cobra.Command {
	var socket, output string
	var pid int
	c := &cobra.Command{
		Use:   "explain PID",
		Short: "which rule applies to a process now",
		Long: `Asks the running daemon which rule applies to process PID now: its workload,
its class and why, the GPUs it holds, and the verdict an open of each GPU
would get. PID is as seen from gpud's PID namespace; --pid PID says the same.`,
		// The process is what explain is about: an admin types
		// gpud explain 4242, as kill 4242.
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("explain: unexpected argument %q", args[1])
			}
			if len(args) == 0 {
				return nil
			}
			n, err := strconv.Atoi(args[0])
			switch {
			case err != nil || n <= 0:
				return usagef("explain: %q: want a PID (a positive number)", args[0])
			case c.Flags().Changed("pid") && pid != n:
				return usagef("explain: PID %d and --pid %d: give one", n, pid)
			}
			pid = n
			return nil
		},
		RunE: ran(func(c *cobra.Command, _ []string) error {
			if pid <= 0 {
				return usagef("explain: a PID is required (gpud explain PID)")
			}
			e, err := v1.NewClient(socket).Explain(context.Background(), pid)
			if err != nil {
				return fmt.Errorf("explain: %w", err)
			}
			return status.WriteExplain(c.OutOrStdout(), e, output)
		}),
	}
	c.Flags().StringVar(&socket, "control-socket", v1.DefaultSocket, "control socket of the running daemon")
	c.Flags().IntVar(&pid, "pid", 0, "the process to explain, as the argument PID")
	outputFlag(c, &output, "text", recordOutputs)
	return c
}

func newMonitorCmd() *cobra.Command {
	var socket string
	c := &cobra.Command{
		Use:       "monitor on|off",
		Short:     "switch kernel monitoring on a running daemon",
		ValidArgs: []string{"on\tobserve GPU opens and apply the rules", "off\tfreeze the ledger; the gate allows every open"},
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("monitor: want on or off")
			}
			if len(args) > 1 {
				return usagef("monitor: unexpected argument %q", args[1])
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
