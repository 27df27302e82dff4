package daemon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/status"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

func explainOver(t *testing.T, socket string, pid int) (int, []byte) {
	t.Helper()
	resp, err := v1.NewClient(socket).HTTP.Get(fmt.Sprintf("http://gpud/v1/explain?pid=%d", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// gpud explain's endpoint: a low process next to a high holder, asked over
// the control socket, is told the rule table's verdict for each GPU.
func TestExplainOverControlSocket(t *testing.T) {
	e := sourcelessEnv(t)
	e.cfg.ControlSocket = filepath.Join(e.dir, "gpud.sock")
	e.start()
	reg := e.d.Registry()

	hi, _ := classified(t, reg, "high", occupancy.High, "explain-high")
	hi.doInt("open %s", e.gpus[0].Path)

	lo, lid := classified(t, reg, "low", occupancy.Low, "explain-low")
	lo.doInt("open %s", e.gpus[1].Path)
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 0, hi.pid()) == occupancy.High && testutil.HolderPriority(f, 1, lo.pid()) == occupancy.Low
	})

	code, body := explainOver(t, e.cfg.ControlSocket, lo.pid())
	if code != http.StatusOK {
		t.Fatalf("explain low: %d %s", code, body)
	}
	var ex v1.Explanation
	if err := json.Unmarshal(body, &ex); err != nil {
		t.Fatal(err)
	}
	if ex.PID != lo.pid() || ex.CgroupID != lid || ex.Priority != occupancy.Low || ex.Reason != workload.ReasonLabel ||
		!ex.Enforcing || !ex.Monitoring || ex.Workload == nil || ex.Workload.TaskID != "explain-low" || ex.Workload.Kind != "cgroup" {
		t.Errorf("explanation: %s", body)
	}
	if fmt.Sprint(ex.Holds) != "[1]" || len(ex.GPUs) != 2 {
		t.Fatalf("holds %v, %d GPUs", ex.Holds, len(ex.GPUs))
	}
	if g := ex.GPUs[0]; g.Allow || g.Rule != "high-held/low-opens: deny" || g.HighHolders != 1 || g.Holds {
		t.Errorf("GPU 0: %+v", g)
	}
	if g := ex.GPUs[1]; !g.Allow || g.Rule != "free: allow" || !g.Holds {
		t.Errorf("GPU 1: %+v", g)
	}
	// The verdict is the gate's: the open is refused.
	if got := tryOpen(lo, e.gpus[0].Path); got != "operation not permitted" {
		t.Errorf("the low open explain said is denied: %s", got)
	}
	var text bytes.Buffer
	status.RenderExplain(&text, &ex)
	for _, want := range []string{
		fmt.Sprintf("pid %d (", lo.pid()),
		"priority low: its cgroup was classified low",
		"holds GPU 1",
		"open of GPU 0: deny (rule: high-held/low-opens: deny)",
		"open of GPU 1: allow (rule: free: allow)",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}

	// The high holder: opening GPU 1 would preempt the low one.
	code, body = explainOver(t, e.cfg.ControlSocket, hi.pid())
	if code != http.StatusOK {
		t.Fatalf("explain high: %d %s", code, body)
	}
	ex = v1.Explanation{}
	json.Unmarshal(body, &ex)
	if g := ex.GPUs[1]; ex.Priority != occupancy.High || !g.Allow || g.Rule != "low-held/high-opens: preempt" ||
		len(g.Effects) != 1 || !strings.Contains(g.Effects[0], fmt.Sprintf("killed (pid %d)", lo.pid())) {
		t.Errorf("high on GPU 1: %s", body)
	}

	// A host process: unmanaged, always allowed.
	host := startHelper(t)
	_, body = explainOver(t, e.cfg.ControlSocket, host.pid())
	ex = v1.Explanation{}
	json.Unmarshal(body, &ex)
	if ex.Priority != occupancy.Unmanaged || ex.Reason != workload.ReasonHost || !ex.GPUs[0].Allow || ex.GPUs[0].Rule != "unmanaged opener: allow" {
		t.Errorf("host process: %s", body)
	}

	// No such process; a bad pid.
	if code, body := explainOver(t, e.cfg.ControlSocket, 1<<30); code != http.StatusNotFound || !strings.Contains(string(body), "no process 1073741824") {
		t.Errorf("unknown pid: %d %s", code, body)
	}
	resp, err := v1.NewClient(e.cfg.ControlSocket).HTTP.Get("http://gpud/v1/explain?pid=x")
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("pid=x: %v %v", resp, err)
	}
}
