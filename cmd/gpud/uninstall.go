package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/uninstall"
	"github.com/gpud/gpud/internal/workload/kube"
)

const uninstallAbout = `Remove what gpud leaves on a node: the gate pinned under --bpf-pin-dir
(kept enforcing after a stop by --keep-enforcing), the state file, the
control socket, the preemption journal (unless --keep-records), the
preemption notices under --checkpoint-root, the DRA driver's checkpoint and
its claims' CDI specs under --dra-cdi-dir, and the directories left empty.
Only gpud's own files are removed, never through a symlink.

Claims still prepared on the node keep their CDI spec and the checkpoint
(a restarting container of their pods is created from the spec, and gpud
installed again takes them over); --remove-dra-claims removes them too,
for when their pods are gone.

With --daemonset (the chart's pre-delete hook): turn that DaemonSet's pods
into cleaners, all at once, and wait up to --timeout until every node's
cleaner reports its node clean. Nodes not cleaned in time are listed; their
gate fails open by itself after --fail-open-after.`

func newUninstallCmd() *cobra.Command {
	def := config.Defaults()
	p := uninstall.Paths{}
	var (
		keepRecords, wait, check bool
		daemonSet, namespace     string
		kubeconfig, binary       string
		timeout                  time.Duration
	)
	c := &cobra.Command{
		Use:   "uninstall",
		Short: "remove gpud's pinned gate and state from this node (or, with --daemonset, from every node)",
		Long:  uninstallAbout,
		Args:  noArgs,
		RunE: ran(func(c *cobra.Command, _ []string) error {
			p.KeepRecords = keepRecords
			log := newLogger(c.ErrOrStderr(), new(slog.LevelVar))
			switch {
			case check:
				if left := uninstall.Clean(p); len(left) > 0 {
					return fmt.Errorf("uninstall: still on this node: %s", strings.Join(left, ", "))
				}
				return nil
			case daemonSet != "":
				if namespace == "" {
					return usagef("uninstall: --daemonset needs --namespace (or $POD_NAMESPACE)")
				}
				client, err := kube.NewClient(kubeconfig)
				if err != nil {
					return fmt.Errorf("uninstall: %w", err)
				}
				if client == nil {
					return usagef("uninstall: --daemonset needs --kubeconfig or an in-cluster API server")
				}
				nodeArgs := cleanerArgs(p)
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				cleaned, notCleaned, err := uninstall.Cleanup{
					Client: kube.DaemonSets{Client: client}, Namespace: namespace, DaemonSet: daemonSet, Log: log,
					Args:  append(append([]string{"uninstall"}, nodeArgs...), "--wait"),
					Check: append([]string{binary, "uninstall", "--check"}, nodeArgs...),
				}.Run(ctx)
				if err != nil {
					return err
				}
				if len(notCleaned) > 0 {
					// Not an error: a failing pre-delete hook would keep the
					// release (and gpud) installed, which is worse than a
					// gate that fails open on a node that is down anyway.
					log.Warn("nodes not cleaned in time: their gate fails open by itself; run `gpud uninstall` there",
						"nodes", notCleaned, "cleaned", len(cleaned))
				} else {
					log.Info("every node cleaned", "nodes", cleaned)
				}
				return nil
			}
			if err := uninstall.Node(p, log); err != nil {
				return err
			}
			log.Info("gpud's gate and state removed from this node", "host_root", p.HostRoot)
			if !wait {
				return nil
			}
			// A cleaner pod: stay (ready, through --check) until deleted.
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			return nil
		}),
	}
	f := c.Flags()
	f.SortFlags = false
	f.StringVar(&p.HostRoot, "host-root", "/", "where the node's / is seen (/host in a cleaner pod: the Job mounts the node's / there); the file paths are resolved under it")
	f.StringVar(&p.PinDir, "bpf-pin-dir", def.PinDir, "bpffs directory of the pinned gate (as this process sees it)")
	f.StringVar(&p.StateFile, "state-file", def.StateFile, "gpud's state file")
	f.StringVar(&p.ControlSocket, "control-socket", def.ControlSocket, "gpud's control socket")
	f.StringVar(&p.StateDir, "state-dir", def.StateDir, "gpud's durable data (journal)")
	f.StringVar(&p.CheckpointRoot, "checkpoint-root", def.CheckpointRoot, "where gpud wrote preemption notices")
	f.StringVar(&p.DRACDIDir, "dra-cdi-dir", def.DRACDIDir, "where gpud wrote the CDI specs of DRA claims")
	f.BoolVar(&keepRecords, "keep-records", false, "keep the preemption journal")
	f.BoolVar(&p.RemoveDRAClaims, "remove-dra-claims", false, "remove the CDI specs and checkpoint of DRA claims still prepared too (their pods' containers can no longer restart)")
	f.BoolVar(&wait, "wait", false, "after cleaning, stay until SIGTERM (a cleaner pod)")
	f.BoolVar(&check, "check", false, "remove nothing: exit 0 if nothing of gpud is left on this node, 1 listing what is")
	f.StringVar(&daemonSet, "daemonset", "", "turn this DaemonSet's pods into cleaners and wait for every node")
	f.StringVar(&namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the DaemonSet's namespace")
	f.StringVar(&kubeconfig, "kubeconfig", "", "API server for --daemonset (\"\": in-cluster)")
	f.DurationVar(&timeout, "timeout", 3*time.Minute, "with --daemonset: how long to wait for the cleaners")
	f.StringVar(&binary, "cleaner-binary", "/gpud", "with --daemonset: gpud's path in its image (for the cleaners' readiness check)")
	return c
}

// cleanerArgs are the node flags a cleaner pod is started with: the ones
// this command was given, so that the chart renders them once.
func cleanerArgs(p uninstall.Paths) []string {
	return []string{
		"--host-root=" + p.HostRoot,
		"--bpf-pin-dir=" + p.PinDir,
		"--state-file=" + p.StateFile,
		"--control-socket=" + p.ControlSocket,
		"--state-dir=" + p.StateDir,
		"--checkpoint-root=" + p.CheckpointRoot,
		"--dra-cdi-dir=" + p.DRACDIDir,
		"--keep-records=" + strconv.FormatBool(p.KeepRecords),
		"--remove-dra-claims=" + strconv.FormatBool(p.RemoveDRAClaims),
	}
}
