package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// servePlugin serves the test plugin on a unix socket, as kubelet reaches
// it, and dials it.
func servePlugin(t *testing.T) (pluginapi.DevicePluginClient, *refusing) {
	t.Helper()
	s, b := testService()
	// A short directory: a unix socket path is at most 107 bytes.
	dir, err := os.MkdirTemp("", "gpud-dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s.p.KubeletDir, s.p.Endpoint = dir, "gpud-test.sock"
	srv, err := s.p.serve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, s.p.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn), b
}

func allocReq(containers ...[]string) *pluginapi.AllocateRequest {
	req := &pluginapi.AllocateRequest{}
	for _, c := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: c})
	}
	return req
}

func many(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// Hostile requests over a real gRPC connection: each gets a clear error of
// the right code, nothing is granted, the backend is asked about nothing it
// did not list, and the server goes on serving good requests, including
// after a message over gRPC's 4 MiB limit.
func TestHostileRequestsOverGRPC(t *testing.T) {
	c, b := servePlugin(t)
	long := strings.Repeat("g", 1<<20) // a 1 MiB id
	good := func(t *testing.T) {
		t.Helper()
		resp, err := c.Allocate(context.Background(), allocReq([]string{"gpu-0", "gpu-2"}))
		if err != nil || len(resp.ContainerResponses) != 1 || len(resp.ContainerResponses[0].Devices) != 2 ||
			resp.ContainerResponses[0].Devices[1].HostPath != "/dev/nvidia2" {
			t.Fatalf("good Allocate after a hostile one: %v, %v", resp, err)
		}
	}
	for _, tc := range []struct {
		name string
		call func(context.Context) error
		code codes.Code
		msg  string // in the error message
	}{
		{"allocate: no container requests", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, &pluginapi.AllocateRequest{})
			return err
		}, codes.InvalidArgument, "no container requests"},
		{"allocate: a container request without ids", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{"gpu-0"}, nil))
			return err
		}, codes.InvalidArgument, "names no device"},
		{"allocate: unknown id", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{"gpu-0", "gpu-7"}))
			return err
		}, codes.InvalidArgument, `unknown device "gpu-7"`},
		{"allocate: empty id", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{""}))
			return err
		}, codes.InvalidArgument, `unknown device ""`},
		{"allocate: duplicate id", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{"gpu-1", "gpu-0", "gpu-1"}))
			return err
		}, codes.InvalidArgument, `device "gpu-1" requested twice`},
		{"allocate: one device to two containers", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{"gpu-1"}, []string{"gpu-1"}))
			return err
		}, codes.InvalidArgument, `device "gpu-1" requested twice`},
		{"allocate: 20000 unknown ids", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq(many("gpu-x", 20000)))
			return err
		}, codes.InvalidArgument, `unknown device "gpu-x0"`},
		{"allocate: 20000 container requests, the last bad", func(ctx context.Context) error {
			req := allocReq()
			for range 20000 {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: []string{"gpu-0"}})
			}
			_, err := c.Allocate(ctx, req)
			return err
		}, codes.InvalidArgument, `device "gpu-0" requested twice`},
		{"allocate: a 1 MiB id", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{long}))
			return err
		}, codes.InvalidArgument, "(1048576 bytes)"},
		{"allocate: a device the backend refuses", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{refusedID}))
			return err
		}, codes.FailedPrecondition, "no longer lendable"},
		{"allocate: over the 4 MiB message limit", func(ctx context.Context) error {
			_, err := c.Allocate(ctx, allocReq([]string{long, long, long, long, long}))
			return err
		}, codes.ResourceExhausted, "larger than max"},
		{"preferred: unknown must-include", func(ctx context.Context) error {
			_, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: []string{"gpu-0", "gpu-1"}, MustIncludeDeviceIDs: []string{"gpu-5"}, AllocationSize: 1}}})
			return err
		}, codes.InvalidArgument, `must include: unknown device "gpu-5"`},
		{"preferred: size over what is available", func(ctx context.Context) error {
			_, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: []string{"gpu-0"}, AllocationSize: 1 << 30}}})
			return err
		}, codes.InvalidArgument, "size out of range"},
		{"preferred: negative size", func(ctx context.Context) error {
			_, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: []string{"gpu-0"}, AllocationSize: 0}, {AvailableDeviceIDs: []string{"gpu-0"}, AllocationSize: -1}}})
			return err
		}, codes.InvalidArgument, "size out of range"},
		{"preferred: must-include over the size", func(ctx context.Context) error {
			_, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: []string{"gpu-0", "gpu-1"}, MustIncludeDeviceIDs: []string{"gpu-0", "gpu-1"}, AllocationSize: 1}}})
			return err
		}, codes.InvalidArgument, "2 devices must be included in 1"},
		{"pre-start: unknown id", func(ctx context.Context) error {
			_, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"gpu-0", long}})
			return err
		}, codes.InvalidArgument, "pre-start: unknown device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.mu.Lock()
			b.asked = nil
			b.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err := tc.call(ctx)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %.300v, want %v with %q", err, tc.code, tc.msg)
			}
			if len(err.Error()) > 512 {
				t.Errorf("error message of %d bytes", len(err.Error()))
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
			b.mu.Lock()
			asked := b.asked
			b.mu.Unlock()
			for _, ids := range asked {
				for _, id := range ids {
					if _, ok := testNodes()[id]; !ok {
						t.Fatalf("backend asked about %.80q", id)
					}
				}
			}
			if tc.code == codes.InvalidArgument && len(asked) > 0 {
				t.Fatalf("backend asked %d times for a malformed request", len(asked))
			}
			good(t)
		})
	}

	// Large but legitimate: a preferred allocation among 50000 available
	// ids (stale ones among ours) answers with ours only, quickly.
	avail := append(many("stale-", 50000), "gpu-2", "gpu-0")
	start := time.Now()
	resp, err := c.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: avail, MustIncludeDeviceIDs: []string{"gpu-0"}, AllocationSize: 40000}}})
	if err != nil || len(resp.ContainerResponses) != 1 || strings.Join(resp.ContainerResponses[0].DeviceIDs, ",") != "gpu-0,gpu-2" {
		t.Fatalf("preferred among 50000: %v, %v", resp, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("preferred among 50000 took %v", d)
	}
	good(t)
}
