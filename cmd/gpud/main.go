// Command gpud is the node daemon and its CLI: run, status, explain,
// monitor, version, completion. The commands are cobra's; what they print
// is internal/status's, and `gpud run`'s settings are internal/config's.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpud/gpud/internal/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// usageError marks bad invocations (flags, arguments, config): exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// runError is a command that started and failed: exit status 1. Anything
// cobra refuses before a command runs (an unknown command or flag, a
// missing argument) is a usage error.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// ran wraps a command's body so that its failures exit 1, its usage errors 2.
func ran(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		var ue usageError
		if err == nil || errors.As(err, &ue) {
			return err
		}
		return runError{err}
	}
}

const about = `gpud: lend idle GPUs, take them back in milliseconds

Flags go anywhere on the command line (gpud monitor on --control-socket S);
every command takes -h. gpud run's settings also come from GPUD_* variables
and --config FILE (see gpud run -h).`

// newRoot builds the command tree. Each command's flags are defined in its
// own constructor: gpud run's, the long list, in runFlags (run.go) only.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "gpud",
		Short:         "lend idle GPUs, take them back in milliseconds",
		Long:          about,
		Version:       version,
		SilenceErrors: true,         // reported once, by exitCode
		SilenceUsage:  true,         // an error is one line, not the help
		Args:          cobra.NoArgs, // an unknown command is an error, not the help
		RunE:          func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("gpud {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		var ue usageError
		if errors.As(err, &ue) {
			return ue // a value's own check (-o's) names the command itself
		}
		return usagef("%s: %v", c.Name(), err)
	})
	root.AddCommand(newRunCmd(), newStatusCmd(), newExplainCmd(), newMonitorCmd(), newUninstallCmd(), newVersionCmd(), newThawGuardCmd())
	// cobra's own `completion bash|zsh|fish|powershell` stays, visible.
	return root
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	if len(args) == 0 {
		root.SetOut(stderr)
		_ = root.Help()
		return 2
	}
	// Go's flag package, which parsed gpud's flags before cobra, took
	// -name as well as --name: scripts written then keep working.
	if c, _, err := root.Find(args); err == nil {
		c.InitDefaultHelpFlag()
		args = config.LongDashes(c.Flags(), args)
	}
	root.SetArgs(args)
	return exitCode(root.Execute(), stderr)
}

func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "gpud:", err)
	var re runError
	if errors.As(err, &re) {
		return 1
	}
	return 2
}
