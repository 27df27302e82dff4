package occupancy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

const ctrID = "3f1c2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"

// sampleSnapshot is a snapshot with a free, a busy and an idle GPU, its
// times in a zone other than UTC.
func sampleSnapshot() Snapshot {
	zone := time.FixedZone("CET", 3600)
	taken := time.Date(2025, 3, 1, 13, 0, 0, 0, zone)
	return Snapshot{
		Version: 42,
		Taken:   taken,
		GPUs: []GPUView{
			{GPU: GPU{Index: 0, UUID: "GPU-aaa", Device: "/dev/nvidia0", Major: 195, Minor: 0}, State: Free},
			{
				GPU: GPU{Index: 1, UUID: "GPU-bbb", Device: "/dev/nvidia1", Major: 195, Minor: 1}, State: Busy,
				LastActive: taken.Add(-time.Second),
				Holders: []HolderView{
					{ProcInfo: ProcInfo{PID: 100, StartTime: 9, Comm: "python3", CgroupID: 77, ContainerID: ctrID,
						PodUID: "1a2b3c4d-0000-1111-2222-333344445555"}, FDs: []int32{3, 4, 9}, OpenedAt: taken.Add(-time.Hour)},
					{ProcInfo: ProcInfo{PID: 200, Comm: "nvidia-smi", Priority: High}, FDs: []int32{5}, OpenedAt: taken.Add(-time.Minute)},
				},
			},
			{
				GPU: GPU{Index: 2, UUID: "", Device: "/dev/nvidia2"}, State: Idle,
				LastActive: taken.Add(-10 * time.Minute),
				Holders: []HolderView{
					{ProcInfo: ProcInfo{PID: 300, Comm: "sleeper", Priority: Low}, FDs: []int32{7}, OpenedAt: taken.Add(-2 * time.Hour)},
				},
			},
		},
	}
}

func TestRender(t *testing.T) {
	s := sampleSnapshot()
	f := Render(s, "node-a", true)
	utc := func(d time.Duration) time.Time { return s.Taken.Add(d).UTC() }
	want := v1.StateFile{
		Version: 1, Node: "node-a", UpdatedAt: utc(0), Monitoring: true,
		GPUs: []v1.StateGPU{
			{Index: 0, UUID: "GPU-aaa", Device: "/dev/nvidia0", State: Free, Holders: []v1.StateHolder{}},
			{Index: 1, UUID: "GPU-bbb", Device: "/dev/nvidia1", State: Busy, Holders: []v1.StateHolder{
				{PID: 100, Comm: "python3", CgroupID: 77, ContainerID: ctrID, PodUID: "1a2b3c4d-0000-1111-2222-333344445555",
					Priority: Unclassified, OpenedAt: utc(-time.Hour), FDs: 3},
				{PID: 200, Comm: "nvidia-smi", Priority: High, OpenedAt: utc(-time.Minute), FDs: 1},
			}},
			{Index: 2, Device: "/dev/nvidia2", State: Idle, IdleSince: ptr(utc(-10 * time.Minute)), Holders: []v1.StateHolder{
				{PID: 300, Comm: "sleeper", Priority: Low, OpenedAt: utc(-2 * time.Hour), FDs: 1},
			}},
		},
		Preemptions: []v1.RawPreemption{},
	}
	if !reflect.DeepEqual(f, want) {
		got, _ := json.MarshalIndent(f, "", " ")
		exp, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("Render =\n%s\nwant\n%s", got, exp)
	}
	if f.UpdatedAt.Location() != time.UTC || f.GPUs[2].IdleSince.Location() != time.UTC ||
		f.GPUs[1].Holders[0].OpenedAt.Location() != time.UTC {
		t.Error("times not in UTC")
	}
	if Render(s, "n", false).Monitoring {
		t.Error("monitoring=false rendered as true")
	}
}

func ptr[T any](v T) *T { return &v }

func TestRenderJSONText(t *testing.T) {
	for _, tc := range []struct {
		name string
		snap Snapshot
		want []string // substrings of the compact JSON
		not  []string
	}{
		{
			name: "no GPUs",
			snap: Snapshot{Taken: t0},
			want: []string{`"gpus":[]`, `"preemptions":[]`, `"version":1`, `"updated_at":"2025-03-01T12:00:00Z"`},
			not:  []string{`null`},
		},
		{
			name: "free GPU",
			snap: Snapshot{Taken: t0, GPUs: []GPUView{{GPU: GPU{Index: 3}, State: Free, LastActive: t0}}},
			want: []string{`"holders":[]`, `"idle_since":null`, `"state":"free"`, `"index":3`, `"owner":""`, `"borrower":""`},
		},
		{
			name: "idle GPU",
			snap: Snapshot{Taken: t0, GPUs: []GPUView{{GPU: GPU{Index: 0}, State: Idle, LastActive: t0.Add(-time.Minute),
				Holders: []HolderView{{ProcInfo: ProcInfo{PID: 5}, FDs: []int32{1, 2}, OpenedAt: t0}}}}},
			want: []string{`"idle_since":"2025-03-01T11:59:00Z"`, `"priority":"unclassified"`, `"fds":2`, `"pid":5`},
		},
		{
			name: "busy GPU has no idle_since",
			snap: Snapshot{Taken: t0, GPUs: []GPUView{{GPU: GPU{Index: 0}, State: Busy, LastActive: t0.Add(-time.Minute),
				Holders: []HolderView{{ProcInfo: ProcInfo{PID: 5}, FDs: []int32{1}, OpenedAt: t0}}}}},
			want: []string{`"idle_since":null`, `"state":"busy"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Render(tc.snap, "n", true)
			b, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !bytes.Contains(b, []byte(w)) {
					t.Errorf("%s lacks %s", b, w)
				}
			}
			for _, w := range tc.not {
				if bytes.Contains(b, []byte(w)) {
					t.Errorf("%s has %s", b, w)
				}
			}
		})
	}
}

// TestStateFileFieldNames pins the JSON names other tools read.
func TestStateFileFieldNames(t *testing.T) {
	f := Render(sampleSnapshot(), "node-a", true)
	f.Preemptions = []v1.RawPreemption{json.RawMessage(`{"pid":1}`)}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]json.RawMessage) []string {
		var k []string
		for name := range m {
			k = append(k, name)
		}
		slices.Sort(k)
		return k
	}
	if got, want := keys(doc), []string{"enforcing", "gpus", "monitoring", "node", "preemptions", "updated_at", "version"}; !slices.Equal(got, want) {
		t.Errorf("top-level keys = %v, want %v", got, want)
	}
	var gpus []map[string]json.RawMessage
	if err := json.Unmarshal(doc["gpus"], &gpus); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(gpus[1]), []string{"borrower", "device", "holders", "idle_since", "index", "owner", "state", "uuid"}; !slices.Equal(got, want) {
		t.Errorf("gpu keys = %v, want %v", got, want)
	}
	var holders []map[string]json.RawMessage
	if err := json.Unmarshal(gpus[1]["holders"], &holders); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(holders[0]), []string{"cgroup_id", "comm", "container_id", "fds", "opened_at", "pid", "pod_uid", "priority"}; !slices.Equal(got, want) {
		t.Errorf("holder keys = %v, want %v", got, want)
	}
	for key, want := range map[string]string{
		"version": `1`, "node": `"node-a"`, "monitoring": `true`, "updated_at": `"2025-03-01T12:00:00Z"`, "preemptions": `[{"pid":1}]`,
	} {
		if got := string(doc[key]); got != want {
			t.Errorf("%s = %s, want %s", key, got, want)
		}
	}
	for key, want := range map[string]string{
		"pid": `100`, "comm": `"python3"`, "cgroup_id": `77`, "container_id": `"` + ctrID + `"`,
		"pod_uid": `"1a2b3c4d-0000-1111-2222-333344445555"`, "priority": `"unclassified"`,
		"opened_at": `"2025-03-01T11:00:00Z"`, "fds": `3`,
	} {
		if got := string(holders[0][key]); got != want {
			t.Errorf("holder %s = %s, want %s", key, got, want)
		}
	}
	for key, want := range map[string]string{
		"index": `1`, "uuid": `"GPU-bbb"`, "device": `"/dev/nvidia1"`, "state": `"busy"`, "idle_since": `null`,
	} {
		if got := string(gpus[1][key]); got != want {
			t.Errorf("gpu %s = %s, want %s", key, got, want)
		}
	}
	if got := string(gpus[2]["idle_since"]); got != `"2025-03-01T11:50:00Z"` {
		t.Errorf("idle gpu idle_since = %s", got)
	}
}

func TestWriteReadStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "dir", "state.json") // parents are created
	f := Render(sampleSnapshot(), "node-a", true)
	if err := WriteStateFile(path, &f); err != nil {
		t.Fatal(err)
	}
	got, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, f) {
		t.Errorf("round trip:\n got %+v\nwant %+v", *got, f)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, want 0644", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(path)
	if !bytes.HasSuffix(raw, []byte("}\n")) {
		t.Errorf("file does not end in a newline")
	}
	// Compact, on one line: indenting was most of a write's CPU on a node
	// with hundreds of holders (writeStateFile).
	if n := bytes.Count(raw, []byte("\n")); n != 1 {
		t.Errorf("the state file has %d lines, want it compact on one", n)
	}
	assertOnly(t, filepath.Dir(path), "state.json")

	// Overwrite with another document: the new one is read back.
	f2 := Render(Snapshot{Taken: t0}, "node-b", false)
	f2.Preemptions = []v1.RawPreemption{json.RawMessage(`{"victim":1}`)}
	if err := WriteStateFile(path, &f2); err != nil {
		t.Fatal(err)
	}
	got, err = ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != "node-b" || got.Monitoring || len(got.GPUs) != 0 || len(got.Preemptions) != 1 {
		t.Errorf("after rewrite: %+v", got)
	}
	var pre map[string]int
	if err := json.Unmarshal(got.Preemptions[0], &pre); err != nil || pre["victim"] != 1 {
		t.Errorf("preemption = %s (%v)", got.Preemptions[0], err)
	}
	assertOnly(t, filepath.Dir(path), "state.json")

	if _, err := ReadStateFile(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadStateFile(missing) err = %v, want ErrNotExist", err)
	}
}

// assertOnly fails unless dir holds exactly the named entries.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, names) {
		t.Errorf("%s holds %v, want %v (no temporary files)", dir, got, names)
	}
}

func TestWriteAtomicFailureLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	// The target is a non-empty directory: the rename fails.
	target := filepath.Join(dir, "state.json")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(target, []byte("{}")); err == nil {
		t.Fatal("WriteAtomic onto a directory succeeded")
	}
	assertOnly(t, dir, "state.json")

	// The parent is a file: the directory cannot be made.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(filepath.Join(file, "state.json"), []byte("{}")); err == nil {
		t.Fatal("WriteAtomic under a regular file succeeded")
	}
}

// TestWriteStateFileAtomic rewrites the file while a reader reads it in a
// loop: the reader must never see a partial document.
func TestWriteStateFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	render := func(i int) v1.StateFile {
		s := sampleSnapshot()
		// Vary the size so that a torn read could not look whole.
		s.GPUs = s.GPUs[:1+i%3]
		f := Render(s, strings.Repeat("n", 1+i%97), i%2 == 0)
		return f
	}
	first := render(0)
	if err := WriteStateFile(path, &first); err != nil {
		t.Fatal(err)
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	var reads int
	var readErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			b, err := os.ReadFile(path)
			if err != nil {
				readErr = fmt.Errorf("read %d: %w", reads, err)
				return
			}
			f, err := ParseStateFile(b)
			if err != nil {
				readErr = fmt.Errorf("read %d: %w\n%s", reads, err, b)
				return
			}
			if n := len(f.Node); n == 0 || f.Node != strings.Repeat("n", n) {
				readErr = fmt.Errorf("read %d: node %q", reads, f.Node)
				return
			}
			reads++
		}
	}()
	for i := 1; i <= 200; i++ {
		f := render(i)
		if err := WriteStateFile(path, &f); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if readErr != nil {
		t.Fatal(readErr)
	}
	if reads == 0 {
		t.Error("the reader never read")
	}
	got, err := ReadStateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := render(200); !reflect.DeepEqual(*got, want) {
		t.Errorf("final file = %+v, want %+v", *got, want)
	}
	assertOnly(t, filepath.Dir(path), "state.json")
}

func TestParseStateFileRejects(t *testing.T) {
	good := Render(sampleSnapshot(), "node-a", true)
	valid, err := json.Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseStateFile(valid); err != nil {
		t.Fatalf("valid file rejected: %v", err)
	}
	mutate := func(f func(*v1.StateFile)) []byte {
		var c v1.StateFile
		if err := json.Unmarshal(valid, &c); err != nil {
			t.Fatal(err)
		}
		f(&c)
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"whitespace", []byte(" \n")},
		{"truncated", valid[:len(valid)/2]},
		{"truncated by one byte", valid[:len(valid)-1]},
		{"garbage", []byte("\x00\xff\x13garbage\x7f")},
		{"not an object", []byte(`[1,2,3]`)},
		{"null", []byte(`null`)},
		{"empty object", []byte(`{}`)},
		{"version 2", mutate(func(f *v1.StateFile) { f.Version = 2 })},
		{"version 0", mutate(func(f *v1.StateFile) { f.Version = 0 })},
		{"version as string", []byte(`{"version":"1","gpus":[]}`)},
		{"bad state", mutate(func(f *v1.StateFile) { f.GPUs[1].State = "sleepy" })},
		{"empty state", mutate(func(f *v1.StateFile) { f.GPUs[0].State = "" })},
		{"holder pid 0", mutate(func(f *v1.StateFile) { f.GPUs[1].Holders[1].PID = 0 })},
		{"holder pid negative", mutate(func(f *v1.StateFile) { f.GPUs[2].Holders[0].PID = -4 })},
		{"bad time", bytes.Replace(valid, []byte(`"updated_at":"2025`), []byte(`"updated_at":"x2025`), 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseStateFile(tc.in)
			if !errors.Is(err, ErrBadStateFile) {
				t.Errorf("ParseStateFile(%.60q) = %v, %v; want ErrBadStateFile", tc.in, f, err)
			}
			if f != nil {
				t.Errorf("ParseStateFile returned a document with an error")
			}
		})
	}

	// Every state is accepted, lent included.
	for _, st := range []State{Free, Busy, Idle, Lent} {
		b := mutate(func(f *v1.StateFile) { f.GPUs[0].State = st })
		if _, err := ParseStateFile(b); err != nil {
			t.Errorf("state %s rejected: %v", st, err)
		}
	}
}
