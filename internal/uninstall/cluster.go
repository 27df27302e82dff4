package uninstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Annotation marks gpud's DaemonSet, and its pods' template, as turned
// into cleaners.
const Annotation = "gpud.io/uninstalling"

// Container is the name of gpud's container in its DaemonSet's pods.
const Container = "gpud"

// DaemonSets is the API server as the pre-delete hook asks it
// (kube.DaemonSets over a clientset): this package needs no client of its
// own.
type DaemonSets interface {
	// Patch applies a strategic merge patch to the DaemonSet as
	// fieldManager.
	Patch(ctx context.Context, namespace, name string, patch []byte, fieldManager string) (*appsv1.DaemonSet, error)
	Get(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error)
	// Pods lists the pods of namespace that the label selector matches.
	Pods(ctx context.Context, namespace, selector string) ([]corev1.Pod, error)
}

// Cleanup is one turning of gpud's DaemonSet into cleaners.
type Cleanup struct {
	Client    DaemonSets
	Namespace string
	DaemonSet string
	// Args are the cleaner's arguments (`uninstall ... --wait`), Check its
	// readiness command (ready once the node is clean).
	Args  []string
	Check []string
	// Poll is how often the DaemonSet's pods are read (default 2 s).
	Poll time.Duration
	Log  *slog.Logger
}

// Run restarts every pod of the DaemonSet as a cleaner, all at once (a
// cleaner removes the gate its node's gpud left pinned, which would fail
// open by itself after --fail-open-after anyway), and waits until each
// node's cleaner is ready or ctx ends. It returns the nodes whose gpud
// state is gone, and those where it may not be (a node down, a pod not
// started in time); a DaemonSet that does not exist is nothing to do.
func (c Cleanup) Run(ctx context.Context) (cleaned, notCleaned []string, err error) {
	patch, err := c.patch()
	if err != nil {
		return nil, nil, err
	}
	ds, err := c.Client.Patch(ctx, c.Namespace, c.DaemonSet, patch, "gpud-uninstall")
	if apierrors.IsNotFound(err) {
		c.Log.Info("no DaemonSet: nothing to clean", "namespace", c.Namespace, "daemonset", c.DaemonSet)
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("uninstall: turning %s/%s into cleaners: %w", c.Namespace, c.DaemonSet, err)
	}
	c.Log.Info("DaemonSet turned into cleaners", "namespace", c.Namespace, "daemonset", c.DaemonSet, "generation", ds.Generation)
	gen := ds.Generation
	poll := c.Poll
	if poll <= 0 {
		poll = 2 * time.Second
	}
	werr := wait.PollUntilContextCancel(ctx, poll, true, func(ctx context.Context) (bool, error) {
		cleaned, notCleaned, err = c.progress(ctx, gen)
		if err != nil {
			c.Log.Warn("reading the cleaners", "error", err)
			return false, nil // the API server may be busy: try again until ctx ends
		}
		return len(notCleaned) == 0, nil
	})
	if werr != nil && !errors.Is(werr, context.DeadlineExceeded) && !errors.Is(werr, context.Canceled) {
		return cleaned, notCleaned, fmt.Errorf("uninstall: waiting for the cleaners: %w", werr)
	}
	return cleaned, notCleaned, nil
}

// progress reads the DaemonSet's status and pods: the nodes whose cleaner
// is ready, and the nodes that should run one and have none ready.
func (c Cleanup) progress(ctx context.Context, gen int64) (cleaned, notCleaned []string, err error) {
	ds, err := c.Client.Get(ctx, c.Namespace, c.DaemonSet)
	if err != nil {
		return nil, nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return nil, nil, fmt.Errorf("the DaemonSet's selector: %w", err)
	}
	pods, err := c.Client.Pods(ctx, c.Namespace, sel.String())
	if err != nil {
		return nil, nil, err
	}
	for _, p := range pods {
		if !metav1.IsControlledBy(&p, ds) || p.Spec.NodeName == "" {
			continue
		}
		if p.DeletionTimestamp == nil && p.Annotations[Annotation] != "" && ready(&p) {
			cleaned = append(cleaned, p.Spec.NodeName)
		} else {
			notCleaned = append(notCleaned, p.Spec.NodeName)
		}
	}
	slices.Sort(cleaned)
	cleaned = slices.Compact(cleaned)
	slices.Sort(notCleaned)
	notCleaned = slices.DeleteFunc(slices.Compact(notCleaned), func(n string) bool {
		_, ok := slices.BinarySearch(cleaned, n)
		return ok
	})
	// Until the controller has seen the new template and scheduled a
	// cleaner on every node it wants, some node may have no pod at all.
	if ds.Status.ObservedGeneration < gen || int(ds.Status.DesiredNumberScheduled) > len(cleaned) {
		if len(notCleaned) == 0 {
			notCleaned = []string{fmt.Sprintf("(%d of %d nodes not yet scheduled)", int(ds.Status.DesiredNumberScheduled)-len(cleaned), ds.Status.DesiredNumberScheduled)}
		}
	}
	return cleaned, notCleaned, nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// HostRootVolume and HostRootMount are the node's / as a cleaner pod sees
// it (its --host-root).
const (
	HostRootVolume = "gpud-uninstall-host-root"
	HostRootMount  = "/host"
)

// patch is the strategic merge patch that turns gpud's pods into
// cleaners: every pod at once (maxSurge 0: gpud's hostPort allows one pod
// a node), the cleaner's arguments, its readiness the node's cleanliness,
// no liveness probe (a cleaner serves no HTTP).
func (c Cleanup) patch() ([]byte, error) {
	mark := map[string]any{"annotations": map[string]string{Annotation: time.Now().UTC().Format(time.RFC3339)}}
	p := map[string]any{
		"metadata": mark,
		"spec": map[string]any{
			"updateStrategy": map[string]any{
				"type":          "RollingUpdate",
				"rollingUpdate": map[string]any{"maxUnavailable": "100%", "maxSurge": 0},
			},
			"template": map[string]any{
				"metadata": mark,
				"spec": map[string]any{
					// The node's / for the cleaner: a pod's view of the host
					// through /proc/1/root needs ptrace access to the host's
					// init, which a container's capabilities need not give.
					"volumes": []map[string]any{{
						"name":     HostRootVolume,
						"hostPath": map[string]any{"path": "/", "type": "Directory"},
					}},
					"containers": []map[string]any{{
						"name": Container,
						"args": c.Args,
						"volumeMounts": []map[string]any{{
							"name": HostRootVolume, "mountPath": HostRootMount,
						}},
						"livenessProbe": nil,
						"readinessProbe": map[string]any{
							"exec":             map[string]any{"command": c.Check},
							"httpGet":          nil,
							"periodSeconds":    2,
							"failureThreshold": 1,
						},
					}},
				},
			},
		},
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("uninstall: %w", err)
	}
	return b, nil
}
