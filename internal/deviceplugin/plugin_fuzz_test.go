package deviceplugin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// refusing is the Static backend with one device listed unhealthy, which
// it refuses to allocate (as the lender refuses a GPU no longer lendable),
// and a record of what it was asked to allocate.
type refusing struct {
	*Static
	mu    sync.Mutex
	asked [][]string
}

const refusedID = "gpu-3"

func (b *refusing) Devices() []Device {
	devs := b.Static.Devices()
	for i := range devs {
		devs[i].Healthy = devs[i].ID != refusedID
	}
	return devs
}

func (b *refusing) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	b.mu.Lock()
	b.asked = append(b.asked, slices.Clone(ids))
	b.mu.Unlock()
	if slices.Contains(ids, refusedID) {
		return nil, fmt.Errorf("%w: GPU 3 is no longer lendable", ErrRefused)
	}
	return b.Static.Allocate(ids)
}

func testNodes() map[string]string {
	return map[string]string{"gpu-0": "/dev/nvidia0", "gpu-1": "/dev/nvidia1", "gpu-2": "/dev/nvidia2", refusedID: "/dev/nvidia3"}
}

func testService() (*service, *refusing) {
	b := &refusing{Static: &Static{Nodes: testNodes(), ContainerPath: map[string]string{"gpu-1": "/dev/nvidia0"}}}
	p := &Plugin{ResourceName: "gpud.io/test", Backend: b, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return &service{p: p}, b
}

// ids reads a fuzzer's list: ids separated by commas, "" for none.
func ids(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// containers reads a fuzzer's AllocateRequest: container requests separated
// by semicolons, "!" for a nil one.
func containers(spec string) []*pluginapi.ContainerAllocateRequest {
	if spec == "" {
		return nil
	}
	var out []*pluginapi.ContainerAllocateRequest
	for _, c := range strings.Split(spec, ";") {
		if c == "!" {
			out = append(out, nil)
			continue
		}
		out = append(out, &pluginapi.ContainerAllocateRequest{DevicesIds: ids(c)})
	}
	return out
}

// checkRefusal: a refusal is a gRPC status of the wanted code whose message
// says which call refused, bounded however long the ids.
func checkRefusal(t *testing.T, err error, want codes.Code, what string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != want {
		t.Fatalf("error %v, want %v", err, want)
	}
	if msg := st.Message(); !strings.HasPrefix(msg, what) && want == codes.InvalidArgument || len(msg) > 512 || !utf8.ValidString(msg) {
		t.Fatalf("message %q (%d bytes)", msg, len(msg))
	}
}

// FuzzAllocate: Allocate grants exactly a well-formed request for listed
// devices (every container request naming devices, no id unknown or twice),
// each container getting its devices' nodes in order; anything else is an
// InvalidArgument naming the problem, and the backend is never asked about
// an unknown or repeated id. A device the backend refuses is a
// FailedPrecondition. Never a silent grant.
func FuzzAllocate(f *testing.F) {
	for _, s := range []string{"gpu-0", "gpu-0,gpu-1", "gpu-1;gpu-2", "gpu-0,gpu-1,gpu-2;" + refusedID, // valid
		"", "!", ";", "gpu-0;", "gpu-0;!", ",", "gpu-0,", "gpu-9", "GPU-0", "gpu-0 ", "gpu-00", "gpu-0,gpu-0", "gpu-0;gpu-0", // malformed
		refusedID, "gpu-1," + refusedID, strings.Repeat("gpu-1,", 500) + "gpu-2", strings.Repeat("x", 10000), "\xff\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, b := testService()
		req := &pluginapi.AllocateRequest{ContainerRequests: containers(spec)}
		resp, err := s.Allocate(context.Background(), req)

		// What the answer must be, worked out here.
		known, seen := testNodes(), map[string]bool{}
		malformed := len(req.ContainerRequests) == 0
		refused := false
		for _, r := range req.ContainerRequests {
			if r == nil || len(r.DevicesIds) == 0 {
				malformed = true
				continue
			}
			for _, id := range r.DevicesIds {
				if _, ok := known[id]; !ok || seen[id] {
					malformed = true
				}
				seen[id] = true
				refused = refused || id == refusedID
			}
		}
		for _, asked := range b.asked {
			for _, id := range asked {
				if _, ok := known[id]; !ok {
					t.Fatalf("backend asked about unknown device %q", id)
				}
			}
		}
		switch {
		case malformed:
			if len(b.asked) > 0 {
				t.Fatalf("backend asked %q for a malformed request", b.asked)
			}
			checkRefusal(t, err, codes.InvalidArgument, "allocate")
		case refused:
			checkRefusal(t, err, codes.FailedPrecondition, "")
		default:
			if err != nil {
				t.Fatalf("Allocate(%q): %v", spec, err)
			}
			if len(resp.ContainerResponses) != len(req.ContainerRequests) {
				t.Fatalf("%d responses for %d container requests", len(resp.ContainerResponses), len(req.ContainerRequests))
			}
			for i, r := range req.ContainerRequests {
				devs := resp.ContainerResponses[i].Devices
				if len(devs) != len(r.DevicesIds) {
					t.Fatalf("container %d: %d devices for %q", i, len(devs), r.DevicesIds)
				}
				for j, id := range r.DevicesIds {
					if devs[j].HostPath != known[id] || devs[j].Permissions != "rw" || devs[j].ContainerPath == "" {
						t.Fatalf("container %d: %q got %+v", i, id, devs[j])
					}
				}
			}
		}
		if err != nil && resp != nil {
			t.Fatal("a response with an error")
		}
	})
}

// FuzzGetPreferredAllocation: a well-formed request (size within the
// available ids, must-include ids among them and no more than size, no id
// twice) is answered with size distinct ids, or all the listed ones when
// fewer: the must-include ones first, the rest available ids the backend
// lists. Anything else is an InvalidArgument.
func FuzzGetPreferredAllocation(f *testing.F) {
	f.Add("gpu-0,gpu-1,gpu-2", "", int32(2))
	f.Add("gpu-0,gpu-1,gpu-2", "gpu-2", int32(2))
	f.Add("gpu-0,gpu-1", "gpu-1", int32(1))
	f.Add("gpu-0", "", int32(0))
	f.Add("gpu-9,gpu-0", "", int32(2))            // a stale id
	f.Add("gpu-9,gpu-0", "gpu-9", int32(2))       // kubelet's own choice
	f.Add("gpu-0,gpu-1", "gpu-0", int32(3))       // size over what is available
	f.Add("gpu-0,gpu-1", "", int32(-1))           // negative size
	f.Add("gpu-0,gpu-0,gpu-1", "", int32(2))      // an id twice
	f.Add("gpu-0,gpu-1", "gpu-0,gpu-0", int32(2)) // must-include twice
	f.Add("gpu-0,gpu-1", "gpu-2", int32(2))       // must-include not available
	f.Add("gpu-0,gpu-1,gpu-2", "gpu-0,gpu-1", int32(1))
	f.Add("", "", int32(0))
	f.Add(strings.Repeat("x,", 3000)+"gpu-1", "", int32(3000))
	f.Fuzz(func(t *testing.T, avail, must string, size int32) {
		s, _ := testService()
		r := &pluginapi.ContainerPreferredAllocationRequest{AvailableDeviceIDs: ids(avail), MustIncludeDeviceIDs: ids(must), AllocationSize: size}
		resp, err := s.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{r}})

		av := map[string]bool{}
		malformed := size < 0 || int(size) > len(r.AvailableDeviceIDs) || len(r.MustIncludeDeviceIDs) > int(size)
		for _, id := range r.AvailableDeviceIDs {
			malformed = malformed || av[id]
			av[id] = true
		}
		mu := map[string]bool{}
		for _, id := range r.MustIncludeDeviceIDs {
			malformed = malformed || mu[id] || !av[id]
			mu[id] = true
		}
		if malformed {
			checkRefusal(t, err, codes.InvalidArgument, "preferred allocation")
			return
		}
		if err != nil || len(resp.ContainerResponses) != 1 {
			t.Fatalf("GetPreferredAllocation(%q, %q, %d) = %v, %v", avail, must, size, resp, err)
		}
		got := resp.ContainerResponses[0].DeviceIDs
		known := testNodes()
		listed := 0
		for id := range av {
			if _, ok := known[id]; ok || mu[id] {
				listed++
			}
		}
		if len(got) != min(int(size), listed) {
			t.Fatalf("%d ids %q, want %d", len(got), got, min(int(size), listed))
		}
		if !slices.Equal(got[:len(r.MustIncludeDeviceIDs)], r.MustIncludeDeviceIDs) {
			t.Fatalf("%q does not start with the must-include %q", got, r.MustIncludeDeviceIDs)
		}
		picked := map[string]bool{}
		for _, id := range got {
			_, ok := known[id]
			if picked[id] || !av[id] || !ok && !mu[id] {
				t.Fatalf("preferred %q: %q twice, not available, or not ours", got, id)
			}
			picked[id] = true
		}
	})
}

// FuzzPreStartContainer: pre-start succeeds for listed devices only, each once.
func FuzzPreStartContainer(f *testing.F) {
	for _, s := range []string{"", "gpu-0", "gpu-0,gpu-1," + refusedID, "gpu-9", "gpu-0,gpu-0", ",", strings.Repeat("y", 5000)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, _ := testService()
		_, err := s.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: ids(spec)})
		known, seen := testNodes(), map[string]bool{}
		ok := true
		for _, id := range ids(spec) {
			_, k := known[id]
			ok = ok && k && !seen[id]
			seen[id] = true
		}
		if ok != (err == nil) {
			t.Fatalf("PreStartContainer(%q): %v", spec, err)
		}
		if err != nil {
			checkRefusal(t, err, codes.InvalidArgument, "pre-start")
		}
	})
}
