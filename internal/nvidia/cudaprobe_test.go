//go:build cgo

package nvidia_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/testutil"
)

// The probe of `make gpu-check` (tools/gpucheck/cudaprobe.c) against the
// CUDA double, as scripts/gpu-check.sh --double runs it: the double answers
// its driver-API calls (context on the scripted node, memory, the PTX
// module, launches run on the CPU), the probe's checksums agree with the
// CPU's, and the driver's accounting reaches the NVML double's script
// (a process record with the allocation, samples while launching) and the
// CUDA double's own (a CUDA process gpud's checkpoint calls can find).
func TestCUDAProbeAgainstTheDouble(t *testing.T) {
	lib := testutil.NewCUDADouble(t)
	dir := filepath.Dir(lib)
	node := filepath.Join(dir, "nvidia0") // a plain file: opened as libcuda opens /dev/nvidia0
	nvmlScript := filepath.Join(dir, "nvml-double.txt")
	for path, text := range map[string]string{node: "", nvmlScript: "driver version=570.86.15\ngpu index=3 minor=0 uuid=GPU-00000000-0000-0000-0000-000000000003\n"} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.CUDAScript(t, lib, fmt.Sprintf("driver version=12080\ndevice node=%s uuid=GPU-01234567-89ab-cdef-0123-456789abcdef nvml=3 name=NVIDIA_Test_GPU\nnvml script=%s\n", node, nvmlScript))

	_, file, _, _ := runtime.Caller(0)
	probe := filepath.Join(t.TempDir(), "cudaprobe")
	src := filepath.Join(filepath.Dir(file), "..", "..", "tools", "gpucheck", "cudaprobe.c")
	if b, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", probe, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, b)
	}

	info, err := exec.Command(probe, "--lib", lib, "--info").CombinedOutput()
	if err != nil || !strings.Contains(string(info), "driver_api=12080 devices=1 checkpoint_api=yes") ||
		!strings.Contains(string(info), `device ordinal=0 uuid=GPU-01234567-89ab-cdef-0123-456789abcdef name="NVIDIA Test GPU"`) {
		t.Fatalf("--info: %v\n%s", err, info)
	}

	cmd := exec.Command(probe, "--lib", lib, "--n", "1000", "--reps", "33", "--mem", "64", "idle:0.5", "busy:1", "idle:0.3")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), fmt.Sprintf("ready pid=%d device=0 uuid=GPU-01234567-89ab-cdef-0123-456789abcdef", cmd.Process.Pid)) {
		t.Fatalf("first line %q, want ready", lines.Text())
	}
	// Ready: the context and memory exist, as NVML's process list says.
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if s := read(nvmlScript); !strings.Contains(s, fmt.Sprintf("process gpu=3 pid=%d memory=%d\n", cmd.Process.Pid, 64<<20)) {
		t.Fatalf("NVML's script while the probe holds its context:\n%s", s)
	}
	ckpt, err := nvidia.OpenCUDACheckpoint(lib)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := ckpt.State(cmd.Process.Pid); err != nil || s != nvidia.CUDARunning {
		t.Fatalf("the probe to gpud's checkpoint calls: %q %v, want a running CUDA process", s, err)
	}
	var checks int
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
		if strings.HasPrefix(lines.Text(), "check ok launches=") {
			checks++
		}
	}
	if err := cmd.Wait(); err != nil || checks < 2 || !strings.HasPrefix(rest[len(rest)-1], "done ok launches=") {
		t.Fatalf("probe: %v, %d checks ok:\n%s", err, checks, strings.Join(rest, "\n"))
	}
	s := read(nvmlScript)
	if strings.Contains(s, "process ") {
		t.Errorf("a process record left after cuCtxDestroy:\n%s", s)
	}
	if n := strings.Count(s, fmt.Sprintf("sample gpu=3 pid=%d ", cmd.Process.Pid)); n < 3 || !strings.HasPrefix(s, "driver version=570.86.15\ngpu index=3 ") {
		t.Errorf("%d samples of a second of launches (want one each 100 ms), or the GPU records lost:\n%s", n, s)
	}
}

// A MIG device as libcuda gives it with CUDA_VISIBLE_DEVICES=MIG-...: the
// only device the probe sees, its UUID the MIG UUID, and its context holds
// the GPU instance's capability node beside the parent's node (the node
// gpud keys the slice by), both closed with the context.
func TestCUDAProbeMIGDeviceAgainstTheDouble(t *testing.T) {
	const migUUID = "MIG-8c1d4c2a-0000-4000-8000-00000000000a"
	lib := testutil.NewCUDADouble(t)
	dir := filepath.Dir(lib)
	node := filepath.Join(dir, "nvidia1")         // plain files, opened as libcuda
	capNode := filepath.Join(dir, "nvidia-cap12") // opens the nodes
	nvmlScript := filepath.Join(dir, "nvml-double.txt")
	for path, text := range map[string]string{node: "", capNode: "", nvmlScript: "driver version=570.86.15\n"} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.CUDAScript(t, lib, fmt.Sprintf("driver version=12080\n"+
		"device node=%s uuid=GPU-01234567-89ab-cdef-0123-456789abcdef nvml=0\n"+
		"device node=%s cap=%s uuid=%s nvml=1 name=NVIDIA_Test_GPU_MIG_2g.8gb\nnvml script=%s\n", filepath.Join(dir, "nvidia0"), node, capNode, migUUID, nvmlScript))

	_, file, _, _ := runtime.Caller(0)
	probe := filepath.Join(t.TempDir(), "cudaprobe")
	src := filepath.Join(filepath.Dir(file), "..", "..", "tools", "gpucheck", "cudaprobe.c")
	if b, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", probe, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, b)
	}
	env := append(os.Environ(), "CUDA_VISIBLE_DEVICES="+migUUID)
	info := exec.Command(probe, "--lib", lib, "--info")
	info.Env = env
	b, err := info.CombinedOutput()
	if err != nil || !strings.Contains(string(b), "devices=1 ") ||
		!strings.Contains(string(b), `device ordinal=0 uuid=GPU-8c1d4c2a-0000-4000-8000-00000000000a name="NVIDIA Test GPU MIG 2g.8gb"`) {
		t.Fatalf("--info with CUDA_VISIBLE_DEVICES=%s: %v\n%s", migUUID, err, b)
	}

	cmd := exec.Command(probe, "--lib", lib, "--mem", "16", "idle:3")
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "ready ") {
		t.Fatalf("first line %q, want ready", lines.Text())
	}
	open := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
	for _, fd := range fds {
		if p, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", cmd.Process.Pid, fd.Name())); err == nil {
			open[p] = true
		}
	}
	if !open[node] || !open[capNode] {
		t.Errorf("the MIG device's context holds %v; want the parent's node %s and the capability node %s", open, node, capNode)
	}
	for lines.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("probe: %v", err)
	}
}
