package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// GPUWork is fake GPU work (issue 30 item 7): a process that holds a GPU's
// device node open and spins, which the NVML double reports busy on that
// GPU for the CPU time it gets (run time and run-queue wait), as a GPU
// reports a process with kernels queued. Freezing its cgroup drops its
// utilization to 0, as freezing a real one stops its launches.
type GPUWork struct {
	Cmd *exec.Cmd
	PID int
}

// StartGPUWork starts fake GPU work on NVML GPU index of double: the
// process joins cgroup (a cgroup v2 directory; "" leaves it in the
// test's), opens device (a fake /dev/nvidiaN; "" opens nothing, for tests
// without root), then spins. The double lists it as a compute process of
// the GPU with memory bytes; it is killed, and unlisted, at the end of the
// test.
func StartGPUWork(tb testing.TB, double *NVMLDouble, index int, device, cgroup string, memory uint64) *GPUWork {
	tb.Helper()
	// The shell's own loop: no fork per iteration, so the time it gets is
	// the process's.
	script := `read go; while :; do :; done`
	if device != "" {
		script = `read go; exec 3<>"$0" || exit 1; while :; do :; done`
	}
	cmd := exec.Command("/bin/sh", "-c", script, device)
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	w := &GPUWork{Cmd: cmd, PID: cmd.Process.Pid}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		double.removeProcess(tb, w.PID)
	})
	if cgroup != "" {
		JoinCgroup(tb, cgroup, w.PID) // before it opens or spins
	}
	if _, err := in.Write([]byte("go\n")); err != nil {
		tb.Fatal(err)
	}
	double.addProcess(tb, NVMLProcess{GPU: index, PID: w.PID, Memory: memory, Work: true})
	return w
}

func (n *NVMLDouble) addProcess(tb testing.TB, p NVMLProcess) {
	n.mu.Lock()
	n.processes = append(n.processes, p)
	n.mu.Unlock()
	n.write(tb)
}

func (n *NVMLDouble) removeProcess(tb testing.TB, pid int) {
	n.mu.Lock()
	n.processes = slices.DeleteFunc(n.processes, func(p NVMLProcess) bool { return p.PID == pid })
	n.mu.Unlock()
	n.write(tb)
}

// BusyNS is the time pid's threads ran or waited to run
// (/proc/PID/task/*/schedstat), as the NVML double counts a process's GPU
// use: a frozen process neither runs nor waits. Raw: Linux 6.18 sometimes
// adds a task's frozen time at once at its first run after a thaw: the
// double caps each process's sample at 100 %, and the compute tests read
// it every 20 ms and count a read past the wall time by more than 30 ms
// as the wall time (sharesAt).
func BusyNS(pid int) (int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
		if err != nil {
			continue // the thread is gone
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		run, _ := strconv.ParseInt(f[0], 10, 64)
		wait, _ := strconv.ParseInt(f[1], 10, 64)
		sum += run + wait
	}
	return sum, nil
}
