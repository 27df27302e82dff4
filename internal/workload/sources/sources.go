// Package sources decides which workload sources a node runs and builds
// them: Docker's engine unless its host is "none"; the API server when
// there is one, else the container runtime's CRI; NRI unless its socket is
// "none"; and, for the executor, each one's reclaim action.
package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
	"github.com/gpud/gpud/internal/workload/cri"
	wdocker "github.com/gpud/gpud/internal/workload/docker"
	"github.com/gpud/gpud/internal/workload/kube"
	wnri "github.com/gpud/gpud/internal/workload/nri"
)

// Config is what the sources are told (gpud run's settings).
type Config struct {
	DockerHost  string // "none": no Docker
	KubeConfig  string // "": in-cluster, when there
	NodeName    string // required with an API server
	CRIEndpoint string // without an API server: pod labels from the runtime's sandboxes
	NRISocket   string // "none": no NRI
	CgroupRoot  string
	// Checkpoint is the checkpoint directory NRI mounts into a preempted
	// task's later containers (nil: none).
	Checkpoint func(podUID, namespace, taskID string) (dir string, readOnly, ok bool)
}

// Sources are the sources built, to run until gpud stops.
type Sources struct {
	Kube     kube.Client // nil without an API server
	Pods     *kube.Pods  // nil without an API server
	Events   *kube.Events
	Runtimes preempt.Runtimes // how a reclaimed workload is stopped
	Runners  []func(context.Context)
}

// ErrNoNode: an API server needs this node's name to watch its pods.
var ErrNoNode = errors.New("--node-name (or NODE_NAME) is required with an API server")

// New builds the sources cfg asks for, filling reg; each says on listings
// when it has listed what exists.
func New(cfg Config, reg *workload.Registry, listings *workload.Listings, log *slog.Logger) (*Sources, error) {
	s := &Sources{}
	if cfg.DockerHost != "none" {
		cli, err := wdocker.NewClient(cfg.DockerHost)
		if err != nil {
			return nil, fmt.Errorf("docker: %w", err)
		}
		s.Runtimes.Containers = wdocker.Runtime{Client: cli}
		w := &wdocker.Watcher{Client: cli, Registry: reg, CgroupRoot: cfg.CgroupRoot, Log: log, Synced: listings.Add()}
		s.Runners = append(s.Runners, w.Run)
	}
	if kc, err := kube.NewClient(cfg.KubeConfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	} else if kc != nil {
		if cfg.NodeName == "" {
			return nil, ErrNoNode
		}
		s.Kube = kc
		s.Pods = &kube.Pods{Client: kc, Node: cfg.NodeName, Registry: reg, CgroupRoot: cfg.CgroupRoot, Log: log, Synced: listings.Add()}
		s.Runtimes.Pods = kube.PodRuntime{Client: kc}
		s.Events = kube.NewEvents(kc, reg, cfg.NodeName, log)
		s.Runners = append(s.Runners, s.Pods.Run, s.Events.Run)
	} else if ep := cri.Endpoint(cfg.CRIEndpoint); ep != "" {
		// No API server: pod labels from the runtime's sandboxes; pods are
		// not reclaimed (only the API server can evict).
		c := &cri.Source{Endpoint: ep, Registry: reg, CgroupRoot: cfg.CgroupRoot, Log: log, Synced: listings.Add()}
		s.Runners = append(s.Runners, c.Run)
	}
	if cfg.NRISocket != "none" { // classifies pods before their containers start; waits for the socket
		p := &wnri.Plugin{Socket: cfg.NRISocket, Registry: reg, CgroupRoot: cfg.CgroupRoot, Log: log, Checkpoint: cfg.Checkpoint}
		s.Runners = append(s.Runners, p.Run)
	} else if cfg.Checkpoint != nil {
		log.Info("no NRI (--nri-socket=none): preempted tasks' containers get no checkpoint mount; a task may mount its --checkpoint-root directory itself")
	}
	return s, nil
}
