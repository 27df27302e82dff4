package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// BuildGpud builds the gpud binary once per test binary run (for tests
// that run it as its own process: to SIGKILL it, or as its thaw guard).
var BuildGpud = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gpud-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "gpud")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/gpud/gpud/cmd/gpud").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})
