package dra

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/safefs"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
)

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func spread(xs []float64) float64 {
	return (slices.Max(xs) - slices.Min(xs)) / median(xs)
}

// BenchmarkPrepareClaim: a fresh claim prepared (CDI spec and checkpoint
// written durably, the share in the book) and unprepared again, against
// the floor of that work: two durable writes of the same files with
// safefs. Rounds interleave the two; the figures are medians over the
// rounds and the spread is (max-min)/median of the ratio.
func BenchmarkPrepareClaim(b *testing.B) {
	testutil.RequireRoot(b)
	state, cdi := filepath.Join(b.TempDir(), "state"), filepath.Join(b.TempDir(), "cdi")
	d, err := New(Config{NodeName: "node1", Client: fake.NewClientset(), CDIDir: cdi, StateDir: state,
		Min: 256 << 20, Step: 256 << 20, Default: 4 << 30, GPUs: testGPUs, Book: sharing.NewBook(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	floorDir, err := safefs.OpenDir(filepath.Join(b.TempDir(), "floor"), 0o700)
	if err != nil {
		b.Fatal(err)
	}
	defer floorDir.Close()
	ctx := context.Background()
	const per = 50
	var prep, floor, ratio []float64
	n := 0
	for r := 0; r < 7; r++ {
		t0 := time.Now()
		for i := 0; i < per; i++ {
			n++
			c := claim("c", fmt.Sprintf("uid-%d", n), strings.ToLower(uuid0), "4Gi")
			res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
			if err != nil || res[c.UID].Err != nil {
				b.Fatal(err, res[c.UID].Err)
			}
			if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
				b.Fatal(err)
			}
		}
		p := float64(time.Since(t0).Nanoseconds()) / per
		t0 = time.Now()
		for i := 0; i < per; i++ {
			for _, name := range []string{"spec.json", "ckpt.json"} {
				if err := floorDir.WriteFile(name, make([]byte, 900), 0o600, true); err != nil {
					b.Fatal(err)
				}
				if err := floorDir.Remove(name); err != nil {
					b.Fatal(err)
				}
			}
		}
		f := float64(time.Since(t0).Nanoseconds()) / per
		prep, floor, ratio = append(prep, p), append(floor, f), append(ratio, p/f)
	}
	b.ReportMetric(median(prep)/1e6, "ms/prepare+unprepare")
	b.ReportMetric(median(floor)/1e6, "ms/two-durable-writes")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(spread(ratio), "ratio-spread")
}

// BenchmarkPublishAfterHealthChange: a GPU turns unhealthy → the
// ResourceSlice with its device taint is written to the API server (client-go's fake
// clientset: gpud's own path, not an API server's latency), against the
// floor of one direct update of a ResourceSlice on the same client.
func BenchmarkPublishAfterHealthChange(b *testing.B) {
	testutil.RequireRoot(b)
	dir := b.TempDir()
	cs := fake.NewClientset()
	var mu sync.Mutex
	healthy := true
	gpus := func() []GPU {
		mu.Lock()
		defer mu.Unlock()
		g := testGPUs()
		g[1].Offered = healthy
		if !healthy {
			g[1].Taint = healthTaint(occupancy.GPUHealth{Unhealthy: true, Reason: "XID 48"})
		}
		return g
	}
	d, err := New(Config{NodeName: "node1", Client: cs, CDIDir: filepath.Join(dir, "cdi"), StateDir: filepath.Join(dir, "state"),
		PluginDir: filepath.Join(dir, "plugins/gpud.io"), RegistryDir: filepath.Join(dir, "registry"),
		Min: 256 << 20, Step: 256 << 20, Default: 4 << 30, GPUs: gpus, Book: sharing.NewBook(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	servedResources(cs)
	if _, err := cs.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node1-uid"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx)
	devices := func() int {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return -1
		}
		for _, s := range l.Items {
			if s.Spec.Driver == DriverName {
				n := 0 // untainted
				for _, dev := range s.Spec.Devices {
					if len(dev.Taints) == 0 {
						n++
					}
				}
				return n
			}
		}
		return -1
	}
	wait := func(want int) time.Duration {
		t0 := time.Now()
		for devices() != want {
			if time.Since(t0) > 10*time.Second {
				b.Fatalf("the slice never had %d devices", want)
			}
			time.Sleep(50 * time.Microsecond)
		}
		return time.Since(t0)
	}
	wait(2)
	floorSlice, err := cs.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "floor"}, Spec: resourceapi.ResourceSliceSpec{Driver: "floor.example.com", Pool: resourceapi.ResourcePool{Name: "p", ResourceSliceCount: 1}, AllNodes: new(bool)},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var pub, floor, ratio []float64
	for r := 0; r < 7; r++ {
		var sum time.Duration
		const per = 10
		for i := 0; i < per; i++ {
			mu.Lock()
			healthy = !healthy
			want := 1
			if healthy {
				want = 2
			}
			mu.Unlock()
			d.Changed()
			sum += wait(want)
		}
		p := float64(sum.Nanoseconds()) / per
		t0 := time.Now()
		for i := 0; i < per; i++ {
			floorSlice.Labels = map[string]string{"i": fmt.Sprint(i)}
			if floorSlice, err = cs.ResourceV1().ResourceSlices().Update(ctx, floorSlice, metav1.UpdateOptions{}); err != nil {
				b.Fatal(err)
			}
			for devices() < 0 { // the same List the wait above pays
			}
		}
		f := float64(time.Since(t0).Nanoseconds()) / per
		pub, floor, ratio = append(pub, p), append(floor, f), append(ratio, p/f)
	}
	b.ReportMetric(median(pub)/1e6, "ms/health-change-to-slice")
	b.ReportMetric(median(floor)/1e6, "ms/direct-update")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(spread(ratio), "ratio-spread")
}
