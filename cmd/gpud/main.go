// Command gpud is the node daemon and its CLI: run, status, monitor, version.
package main

import (
	"errors"
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// usageError marks bad invocations (flags, arguments, config): exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

const usage = `gpud: lend idle GPUs, take them back in milliseconds

usage:
  gpud run [flags]            run the node daemon (root); settings also from
                              GPUD_* variables and --config FILE; SIGHUP reloads
  gpud status [-o json]       show GPUs, holders, loans and the last preemptions
              [--watch 1s]
  gpud explain --pid N        which rule applies to a process now [-o json]
  gpud monitor on|off         switch kernel monitoring on a running daemon
  gpud version                print the version

gpud <command> -h shows a command's flags.
`

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(args[1:])
	case "status":
		err = cmdStatus(args[1:])
	case "monitor":
		err = cmdMonitor(args[1:])
	case "explain":
		err = cmdExplain(args[1:])
	case "version", "--version":
		fmt.Println("gpud", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		err = usagef("unknown command %q (see gpud help)", args[0])
	}
	return exitCode(err)
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "gpud:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}
