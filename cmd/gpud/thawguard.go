package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/sharing/compute"
)

// newThawGuardCmd is the thaw guard gpud starts before its compute
// scheduler's first freeze (compute.RunGuard): hidden, for gpud only.
func newThawGuardCmd() *cobra.Command {
	var stateDir, cgroupRoot string
	c := &cobra.Command{
		Use:    compute.GuardCommand,
		Short:  "thaw what gpud's compute scheduler froze once gpud is gone (started by gpud)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return compute.RunGuard(os.Stdin, os.Stdout, stateDir, cgroupRoot)
		},
	}
	// gpud passes its own; the default is still gpud run's, as for every
	// command's flag that names a run setting (TestCommandsShareRunsDefaults).
	c.Flags().StringVar(&stateDir, "state-dir", config.Defaults().StateDir, "gpud's state directory (the compute journal's)")
	c.Flags().StringVar(&cgroupRoot, "cgroup-root", "", "the cgroup v2 mount (\"\" detects it)")
	return c
}
