package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var cudaBuild struct {
	once sync.Once
	lib  []byte
	err  error
}

// BuildCUDADouble compiles internal/nvidia/cudadouble (a libcuda.so.1
// with the CUDA checkpoint API, scripted by the test) once per test binary
// and returns the library's bytes.
func BuildCUDADouble(tb testing.TB) []byte {
	tb.Helper()
	cudaBuild.once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(file), "..", "nvidia", "cudadouble", "cudadouble.c")
		dir, err := os.MkdirTemp("", "cudadouble")
		if err != nil {
			cudaBuild.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "libcuda.so.1")
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "gcc"
		}
		cmd := exec.Command(cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", out, src, "-ldl", "-lpthread")
		if b, err := cmd.CombinedOutput(); err != nil {
			cudaBuild.err = fmt.Errorf("building the CUDA double: %w\n%s", err, b)
			return
		}
		cudaBuild.lib, cudaBuild.err = os.ReadFile(out)
	})
	if cudaBuild.err != nil {
		tb.Fatal(cudaBuild.err)
	}
	return cudaBuild.lib
}

// NewCUDADouble writes the CUDA double into a fresh directory and returns
// the library's path; its script is cuda-double.txt beside it (CUDAScript).
// Each test gets its own copy: dlopen of another path is another library,
// with its own process states.
func NewCUDADouble(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(lib, BuildCUDADouble(tb), 0o755); err != nil {
		tb.Fatal(err)
	}
	return lib
}

// CUDAScript replaces the script of the CUDA double at lib.
func CUDAScript(tb testing.TB, lib, script string) {
	tb.Helper()
	if err := os.WriteFile(filepath.Join(filepath.Dir(lib), "cuda-double.txt"), []byte(script), 0o644); err != nil {
		tb.Fatal(err)
	}
}
