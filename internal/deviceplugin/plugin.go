// Package deviceplugin serves a kubelet device plugin (deviceplugin/v1beta1)
// for one resource. What the devices are, and what an allocation gives a
// container, comes from a Backend: gpud's lender of idle GPUs, or the
// test-only stand-in for nvidia.com/gpu. The plugin registers once its own
// socket serves, and again whenever kubelet.sock is re-created (kubelet
// deletes every plugin socket when it starts).
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Device is one device as the plugin lists it.
type Device struct {
	ID      string
	Healthy bool
}

// Backend decides what the plugin lists and allocates.
type Backend interface {
	// Devices is the current list.
	Devices() []Device
	// Subscribe returns a channel that receives after every change of the
	// list, and a function that ends the subscription.
	Subscribe() (<-chan struct{}, func())
	// Preferred picks size devices among available (mustInclude first).
	Preferred(available, mustInclude []string, size int) []string
	// Allocate returns what a container allocated ids gets, or an error
	// (the request is refused, never silently granted).
	Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error)
}

// ErrRefused marks an allocation the backend refuses; the kubelet gets a
// FailedPrecondition with the reason.
var ErrRefused = errors.New("allocation refused")

// Plugin is one device plugin.
type Plugin struct {
	ResourceName string
	KubeletDir   string // the device-plugins directory, holding kubelet.sock
	Endpoint     string // this plugin's socket file name in KubeletDir
	Backend      Backend
	Log          *slog.Logger
	// Registered, when set, is called after each successful registration.
	Registered func()

	registrations atomic.Uint64 // successful registrations (Registrations)

	mu         sync.Mutex
	registered bool
}

// IsRegistered reports whether the plugin is registered with the current kubelet.
// A nil Plugin (no device plugin) is not.
func (p *Plugin) IsRegistered() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registered
}

// Registrations counts the successful registrations (kubelet restarts make
// more than one); 0 for a nil Plugin.
func (p *Plugin) Registrations() uint64 {
	if p == nil {
		return 0
	}
	return p.registrations.Load()
}

func (p *Plugin) setRegistered(v bool) {
	p.mu.Lock()
	p.registered = v
	p.mu.Unlock()
}

// Run serves and registers until ctx ends.
func (p *Plugin) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("deviceplugin: %w", err)
	}
	defer w.Close()
	if err := os.MkdirAll(p.KubeletDir, 0o755); err != nil {
		return fmt.Errorf("deviceplugin: %w", err)
	}
	if err := w.Add(p.KubeletDir); err != nil {
		return fmt.Errorf("deviceplugin: watching %s: %w", p.KubeletDir, err)
	}
	for ctx.Err() == nil {
		srv, err := p.serve()
		if err != nil {
			p.Log.Error("device plugin: serving", "resource", p.ResourceName, "error", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
				continue
			}
		}
		regCtx, cancelReg := context.WithCancel(ctx)
		go p.registerLoop(regCtx)
		restart := p.waitRestart(ctx, w)
		cancelReg()
		p.setRegistered(false)
		srv.Stop()
		if !restart {
			break
		}
		p.Log.Info("device plugin: kubelet restarted or our socket went; serving and registering again", "resource", p.ResourceName)
	}
	os.Remove(filepath.Join(p.KubeletDir, p.Endpoint))
	return nil
}

// waitRestart waits for a reason to serve again: kubelet.sock re-created,
// or our own socket removed. It returns false when ctx ends.
func (p *Plugin) waitRestart(ctx context.Context, w *fsnotify.Watcher) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case ev := <-w.Events:
			name := filepath.Base(ev.Name)
			if name == kubeletSocket && ev.Has(fsnotify.Create) {
				return true
			}
			if name == p.Endpoint && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
				// Our own replacement of a stale socket removes a file too:
				// only a socket that is really gone means serving again.
				if _, err := os.Stat(filepath.Join(p.KubeletDir, p.Endpoint)); err == nil {
					continue
				}
				return true
			}
		case err := <-w.Errors:
			p.Log.Warn("device plugin: watching the kubelet directory", "error", err)
		}
	}
}

func (p *Plugin) serve() (*grpc.Server, error) {
	path := filepath.Join(p.KubeletDir, p.Endpoint)
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &service{p: p})
	go srv.Serve(ln)
	return srv, nil
}

// registerLoop registers with kubelet, retrying until it succeeds.
func (p *Plugin) registerLoop(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := p.register(ctx)
		if err == nil {
			p.setRegistered(true)
			p.registrations.Add(1)
			p.Log.Info("device plugin registered", "resource", p.ResourceName, "endpoint", p.Endpoint)
			if p.Registered != nil {
				p.Registered()
			}
			return
		}
		p.Log.Debug("device plugin: registration failed; retrying", "error", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
}

func (p *Plugin) register(ctx context.Context) error {
	sock := filepath.Join(p.KubeletDir, kubeletSocket)
	if _, err := os.Stat(sock); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(cctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.Endpoint,
		ResourceName: p.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

type service struct {
	pluginapi.UnimplementedDevicePluginServer
	p *Plugin
}

func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func list(b Backend) *pluginapi.ListAndWatchResponse {
	var out pluginapi.ListAndWatchResponse
	for _, d := range b.Devices() {
		h := pluginapi.Unhealthy
		if d.Healthy {
			h = pluginapi.Healthy
		}
		out.Devices = append(out.Devices, &pluginapi.Device{ID: d.ID, Health: h})
	}
	return &out
}

func (s *service) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ch, cancel := s.p.Backend.Subscribe()
	defer cancel()
	last := list(s.p.Backend)
	if err := stream.Send(last); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-ch:
			cur := list(s.p.Backend)
			if same(cur, last) {
				continue
			}
			if err := stream.Send(cur); err != nil {
				return err
			}
			last = cur
		}
	}
}

func same(a, b *pluginapi.ListAndWatchResponse) bool {
	if len(a.Devices) != len(b.Devices) {
		return false
	}
	for i := range a.Devices {
		if a.Devices[i].ID != b.Devices[i].ID || a.Devices[i].Health != b.Devices[i].Health {
			return false
		}
	}
	return true
}

// The handlers check a request against the devices listed before the
// backend sees it: an unknown id, the same id twice, a container request
// naming none are a clear InvalidArgument (kubelet never sends them; a
// client that does gets nothing), and the backend only ever decides about
// devices it listed. Messages quote at most maxQuotedID bytes of an id.

// known returns the ids the backend lists.
func (s *service) known() map[string]bool {
	devs := s.p.Backend.Devices()
	out := make(map[string]bool, len(devs))
	for _, d := range devs {
		out[d.ID] = true
	}
	return out
}

const maxQuotedID = 64

// quoteID quotes an id for an error message, cut if long.
func quoteID(id string) string {
	if len(id) > maxQuotedID {
		return strconv.Quote(id[:maxQuotedID]) + fmt.Sprintf("… (%d bytes)", len(id))
	}
	return strconv.Quote(id)
}

// checkIDs refuses an id twice in ids (or already in seen, when not nil)
// or, when known is not nil, an id the backend does not list.
func checkIDs(what string, ids []string, known, seen map[string]bool) error {
	if seen == nil {
		seen = make(map[string]bool, len(ids))
	}
	for _, id := range ids {
		if known != nil && !known[id] {
			return status.Errorf(codes.InvalidArgument, "%s: unknown device %s", what, quoteID(id))
		}
		if seen[id] {
			return status.Errorf(codes.InvalidArgument, "%s: device %s requested twice", what, quoteID(id))
		}
		seen[id] = true
	}
	return nil
}

func (s *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	var out pluginapi.PreferredAllocationResponse
	known := s.known()
	for _, r := range req.ContainerRequests {
		if r == nil || r.AllocationSize < 0 || int(r.AllocationSize) > len(r.AvailableDeviceIDs) {
			return nil, status.Error(codes.InvalidArgument, "preferred allocation: size out of range")
		}
		if len(r.MustIncludeDeviceIDs) > int(r.AllocationSize) {
			return nil, status.Errorf(codes.InvalidArgument, "preferred allocation: %d devices must be included in %d",
				len(r.MustIncludeDeviceIDs), r.AllocationSize)
		}
		available := make(map[string]bool, len(r.AvailableDeviceIDs))
		if err := checkIDs("preferred allocation", r.AvailableDeviceIDs, nil, available); err != nil {
			return nil, err
		}
		if err := checkIDs("preferred allocation: must include", r.MustIncludeDeviceIDs, available, nil); err != nil {
			return nil, err
		}
		// Only devices we list are preferred (a stale id would be refused
		// by Allocate); those that must be included are kubelet's choice.
		must := make(map[string]bool, len(r.MustIncludeDeviceIDs))
		for _, id := range r.MustIncludeDeviceIDs {
			must[id] = true
		}
		ordered := make([]string, 0, len(r.AvailableDeviceIDs))
		for _, id := range r.AvailableDeviceIDs {
			if known[id] || must[id] {
				ordered = append(ordered, id)
			}
		}
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: s.p.Backend.Preferred(ordered, r.MustIncludeDeviceIDs, int(r.AllocationSize)),
		})
	}
	return &out, nil
}

func (s *service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	var out pluginapi.AllocateResponse
	if len(req.ContainerRequests) == 0 {
		return nil, status.Error(codes.InvalidArgument, "allocate: no container requests")
	}
	// The whole request is checked before any of it is allocated.
	known, seen := s.known(), map[string]bool{}
	for _, r := range req.ContainerRequests {
		if r == nil || len(r.DevicesIds) == 0 {
			return nil, status.Error(codes.InvalidArgument, "allocate: a container request names no device")
		}
		if err := checkIDs("allocate", r.DevicesIds, known, seen); err != nil {
			s.p.Log.Warn("device plugin: malformed allocation request", "resource", s.p.ResourceName, "error", err)
			return nil, err
		}
	}
	for _, r := range req.ContainerRequests {
		resp, err := s.p.Backend.Allocate(r.DevicesIds)
		if err != nil {
			s.p.Log.Warn("device plugin: allocation refused", "resource", s.p.ResourceName, "devices", r.DevicesIds, "error", err)
			if errors.Is(err, ErrRefused) {
				return nil, status.Error(codes.FailedPrecondition, err.Error())
			}
			return nil, status.Error(codes.Internal, err.Error())
		}
		out.ContainerResponses = append(out.ContainerResponses, resp)
	}
	return &out, nil
}

// PreStartContainer is not asked for (PreStartRequired is false); called
// anyway, it only checks the ids are ours.
func (s *service) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if err := checkIDs("pre-start", req.DevicesIds, s.known(), nil); err != nil {
		return nil, err
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Notifier is the subscription half of a Backend: Notify after every change.
type Notifier struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

// Subscribe implements Backend.Subscribe.
func (n *Notifier) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	if n.subs == nil {
		n.subs = map[chan struct{}]struct{}{}
	}
	n.subs[ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		delete(n.subs, ch)
		n.mu.Unlock()
	}
}

// Notify wakes every subscriber; it never blocks.
func (n *Notifier) Notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for ch := range n.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// kubeletSocket is kubelet's registration socket, in the device-plugins
// directory (pluginapi.KubeletSocket is its full default path).
var kubeletSocket = filepath.Base(pluginapi.KubeletSocket)
