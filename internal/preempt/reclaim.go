package preempt

import (
	"context"
	"errors"
	"fmt"
)

// Reclaim modes (--reclaim). For Docker containers stop and evict both
// stop, remove and delete both remove; for pods stop and evict both use the
// Eviction API, remove and delete both delete the pod.
const (
	ReclaimStop   = "stop"
	ReclaimRemove = "remove"
	ReclaimEvict  = "evict"
	ReclaimDelete = "delete"
	ReclaimNone   = "none"
)

// ParseReclaim checks a --reclaim value.
func ParseReclaim(v string) (string, error) {
	switch v {
	case ReclaimStop, ReclaimRemove, ReclaimEvict, ReclaimDelete, ReclaimNone:
		return v, nil
	}
	return "", fmt.Errorf("preempt: reclaim %q: want stop, remove, evict, delete or none", v)
}

// Gentle reports whether mode stops/evicts (true) or removes/deletes (false).
func Gentle(mode string) bool { return mode == ReclaimStop || mode == ReclaimEvict }

// Target is what gets reclaimed: a pod when PodUID is set, else a container.
type Target struct {
	ContainerID string
	PodUID      string
	Namespace   string
	Name        string // pod name
	Reason      string // for the pod's DisruptionTarget condition and events
}

// Key names the target: one reclaim per key at a time.
func (t Target) Key() string {
	if t.PodUID != "" {
		return "pod/" + t.PodUID
	}
	return t.ContainerID
}

// ErrNotFound is returned by a Runtime for a container that no longer exists:
// a reclaim of it is done, not failed.
var ErrNotFound = errors.New("preempt: container not found")

// Runtime reclaims targets of one kind (mode is never ReclaimNone).
type Runtime interface {
	Reclaim(ctx context.Context, t Target, mode string) error
}

// Runtimes picks the runtime by target: pods to Pods, containers to Containers.
type Runtimes struct {
	Containers Runtime // nil: containers are not reclaimed
	Pods       Runtime // nil: pods are not reclaimed
}

func (r Runtimes) Reclaim(ctx context.Context, t Target, mode string) error {
	rt := r.Containers
	if t.PodUID != "" {
		rt = r.Pods
	}
	if rt == nil {
		return ErrNoRuntime
	}
	return rt.Reclaim(ctx, t, mode)
}

// ErrNoRuntime is returned for a target no configured runtime can reclaim.
var ErrNoRuntime = errors.New("preempt: no runtime for this target")
