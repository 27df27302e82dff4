// Package cri classifies pods without an API server, from the labels kubelet
// copies onto their sandboxes, listed over the container runtime's CRI socket.
package cri

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/workload"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Source classifies pods without an API server: kubelet copies a pod's labels
// onto its sandbox, which the container runtime lists over CRI. The runtime
// has no watch that every version serves, so the sandboxes are listed every
// Interval (default 500ms).
type Source struct {
	Endpoint   string // unix socket path or unix:// URL of the runtime
	Registry   *workload.Registry
	CgroupRoot string
	Log        *slog.Logger
	Interval   time.Duration
	// Synced, when set, is called after every successful listing.
	Synced func()

	known map[string]bool // pod uids put in the registry
}

// Run lists sandboxes until ctx ends.
func (c *Source) Run(ctx context.Context) {
	target := c.Endpoint
	if !strings.HasPrefix(target, "unix://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.Log.Error("CRI endpoint", "endpoint", c.Endpoint, "error", err)
		return
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	every := c.Interval
	if every == 0 {
		every = 500 * time.Millisecond
	}
	failing := false
	for {
		err := c.sync(ctx, rs)
		if err == nil && c.Synced != nil {
			c.Synced()
		}
		if err != nil && !failing {
			c.Log.Warn("listing pod sandboxes over CRI", "endpoint", c.Endpoint, "error", err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (c *Source) sync(ctx context.Context, rs runtimeapi.RuntimeServiceClient) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := rs.ListPodSandbox(cctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}},
	})
	if err != nil {
		return fmt.Errorf("ListPodSandbox: %w", err)
	}
	seen := map[string]bool{}
	for _, sb := range resp.Items {
		md := sb.GetMetadata()
		if md == nil || md.Uid == "" {
			continue
		}
		seen[md.Uid] = true
		w := SandboxWorkload(c.Registry, md.Uid, md.Namespace, md.Name, sb.Labels)
		w.CgroupID = cgroups.PodID(c.CgroupRoot, md.Uid, "") // no QoS class on a sandbox: every layout is tried
		if c.Registry.Holds(w) {
			continue
		}
		c.Registry.Put(w)
	}
	for uid := range c.known {
		if !seen[uid] {
			c.Registry.RemovePod(uid)
		}
	}
	c.known = seen
	return nil
}

// SandboxWorkload classifies a pod from its sandbox's labels.
func SandboxWorkload(r *workload.Registry, uid, namespace, name string, labels map[string]string) workload.Workload {
	w := workload.Workload{PodUID: uid, Namespace: namespace, Name: name, TaskID: labels[workload.LabelTaskID],
		PreemptMode: labels[workload.LabelPreemptMode]}
	w.Priority, w.Agent = r.ClassifyPod(uid, namespace, labels)
	if w.TaskID == "" {
		w.TaskID = namespace + "/" + name
	}
	return w
}

// Endpoint resolves --cri-endpoint: "none" disables, "" picks the first
// default runtime socket that exists.
func Endpoint(v string) string {
	switch v {
	case "none":
		return ""
	case "":
		for _, p := range []string{"/run/containerd/containerd.sock", "/run/crio/crio.sock"} {
			if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
				return p
			}
		}
		return ""
	}
	return v
}
