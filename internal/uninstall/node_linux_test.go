package uninstall

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/dra"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

const nobody = 65534 // another, unprivileged user

// node is a fake node's / (root-owned, as the rule wants) with gpud's files
// where the chart puts them, seen under HostRoot as from a cleaner pod.
func node(t *testing.T) (string, Paths) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	p := Paths{
		HostRoot:       root,
		StateFile:      "/run/gpud/state.json",
		ControlSocket:  "/run/gpud/gpud.sock",
		StateDir:       "/var/lib/gpud",
		CheckpointRoot: "/var/lib/gpud/checkpoints",
	}
	for _, f := range []string{p.StateFile, p.ControlSocket, "/var/lib/gpud/" + JournalFile,
		"/var/lib/gpud/checkpoints/ml/task-a/" + journal.CheckpointFile,
		"/var/lib/gpud/checkpoints/_legacy/task-b/" + journal.CheckpointFile, "/var/lib/gpud/checkpoints/" + journal.LayoutFile} {
		write(t, filepath.Join(root, f))
	}
	return root, p
}

func write(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// Everything gpud wrote goes, and so do its directories.
func TestNodeRemovesGpudsFilesAndDirectories(t *testing.T) {
	root, p := node(t)
	if left := Clean(p); !slices.Equal(left, []string{p.StateFile, p.ControlSocket}) {
		t.Fatalf("Clean before: %v", left)
	}
	if err := Node(p, slog.Default()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/run/gpud", "/var/lib/gpud"} {
		if exists(filepath.Join(root, d)) {
			t.Errorf("%s left", d)
		}
	}
	for _, d := range []string{"/run", "/var/lib"} {
		if !exists(filepath.Join(root, d)) {
			t.Errorf("%s removed: not gpud's", d)
		}
	}
	if left := Clean(p); len(left) != 0 {
		t.Errorf("Clean after: %v", left)
	}
	// Twice is fine: a cleaner restarted, or the hook run again.
	if err := Node(p, slog.Default()); err != nil {
		t.Errorf("second run: %v", err)
	}
}

// What gpud did not write stays: a task's own checkpoint, the journal when
// asked, a file planted through a symlink, a directory another user owns.
func TestNodeRemovesOnlyGpudsOwnFiles(t *testing.T) {
	root, p := node(t)
	p.KeepRecords = true
	ckpt := filepath.Join(root, "/var/lib/gpud/checkpoints/ml/task-a/model.ckpt")
	write(t, ckpt)
	// A user's link where the state file was: the link goes, not its target.
	victim := filepath.Join(root, "etc/important")
	write(t, victim)
	sf := filepath.Join(root, p.StateFile)
	os.Remove(sf)
	if err := os.Symlink(victim, sf); err != nil {
		t.Fatal(err)
	}
	// A task directory another user made: not gpud's, left with its file.
	theirs := testutil.MkdirOwned(t, filepath.Join(root, "/var/lib/gpud/checkpoints/ml/task-c"), 0o755, nobody)
	write(t, filepath.Join(theirs, journal.CheckpointFile))

	if err := Node(p, slog.Default()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ckpt, victim, filepath.Join(root, "/var/lib/gpud", JournalFile), filepath.Join(theirs, journal.CheckpointFile)} {
		if !exists(f) {
			t.Errorf("%s removed", f)
		}
	}
	for _, f := range []string{sf, filepath.Join(root, "/var/lib/gpud/checkpoints/ml/task-a", journal.CheckpointFile), filepath.Join(root, "/var/lib/gpud/checkpoints/_legacy/task-b"), filepath.Join(root, "/run/gpud")} {
		if exists(f) {
			t.Errorf("%s left", f)
		}
	}
}

// A directory on the way that another user can change is refused: nothing
// under it is touched.
func TestNodeRefusesADirectoryOthersCanWrite(t *testing.T) {
	root, p := node(t)
	if err := os.Chmod(filepath.Join(root, "/run/gpud"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := Node(p, slog.Default()); err == nil {
		t.Fatal("no error for a world-writable /run/gpud")
	}
	if !exists(filepath.Join(root, p.StateFile)) {
		t.Error("the state file in a world-writable directory was removed")
	}
}

// Directories that are not gpud's are never removed, even empty.
func TestOwnedDir(t *testing.T) {
	for d, want := range map[string]bool{
		"/": false, "/run": false, "/tmp": false, "/run/gpud": true, "/var/lib/gpud": true,
		"/var/lib/gpud/checkpoints": true, "/data/ckpt": false,
	} {
		if got := ownedDir(d, "/var/lib/gpud"); got != want {
			t.Errorf("ownedDir(%s) = %v, want %v", d, got, want)
		}
	}
}

// claimsNode is node with gpud's DRA driver's leftovers: a checkpoint (the
// driver's format, version 1) listing the claims prepared, their CDI specs,
// and NVIDIA's own spec beside them.
func claimsNode(t *testing.T, prepared ...string) (string, Paths) {
	root, p := node(t)
	p.DRACDIDir = "/var/run/cdi"
	claims := map[string]any{}
	for _, uid := range prepared {
		claims[uid] = map[string]any{"namespace": "ml", "name": "claim-" + uid, "devices": []any{}, "shares": []any{}}
	}
	b, err := json.Marshal(map[string]any{"version": 1, "claims": claims})
	if err != nil {
		t.Fatal(err)
	}
	ckpt := filepath.Join(root, p.StateDir, dra.CheckpointFile)
	if err := os.WriteFile(ckpt, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"gpud.io-claim_uid-a.json", "gpud.io-claim_uid-b.json", "nvidia.com-gpu.json"} {
		write(t, filepath.Join(root, p.DRACDIDir, f))
	}
	return root, p
}

// A claim still prepared keeps its CDI spec and the checkpoint (its pod's
// containers restart from the spec); a spec no claim is prepared for
// goes; NVIDIA's spec stays. The readiness check still reports the node
// clean: the cleaner must not wait for pods to end.
func TestNodeKeepsPreparedClaims(t *testing.T) {
	root, p := claimsNode(t, "uid-a")
	var logs testutil.Buffer
	if err := Node(p, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	cdi := filepath.Join(root, p.DRACDIDir)
	for _, f := range []string{filepath.Join(cdi, "gpud.io-claim_uid-a.json"), filepath.Join(cdi, "nvidia.com-gpu.json"), filepath.Join(root, p.StateDir, dra.CheckpointFile)} {
		if !exists(f) {
			t.Errorf("%s removed", f)
		}
	}
	if exists(filepath.Join(cdi, "gpud.io-claim_uid-b.json")) {
		t.Error("the spec of a claim not prepared is left")
	}
	if !strings.Contains(logs.String(), "ml/claim-uid-a (uid-a)") || !strings.Contains(logs.String(), "--remove-dra-claims") {
		t.Errorf("the log does not name the claim kept and how to remove it:\n%s", logs.String())
	}
	if left := Clean(p); len(left) != 0 {
		t.Errorf("Clean: %v", left)
	}

	// Once the pods are gone, the admin removes them: the state directory
	// goes too.
	p.RemoveDRAClaims = true
	if err := Node(p, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(cdi, "gpud.io-claim_uid-a.json")) || exists(filepath.Join(root, p.StateDir)) {
		t.Error("--remove-dra-claims left the spec or the state directory")
	}
	if !exists(filepath.Join(cdi, "nvidia.com-gpu.json")) {
		t.Error("NVIDIA's spec removed")
	}
}

// No claim prepared: the checkpoint and every claim spec go, and so does
// the state directory.
func TestNodeRemovesClaimsLeftUnprepared(t *testing.T) {
	root, p := claimsNode(t)
	if err := Node(p, slog.Default()); err != nil {
		t.Fatal(err)
	}
	cdi := filepath.Join(root, p.DRACDIDir)
	for _, f := range []string{filepath.Join(cdi, "gpud.io-claim_uid-a.json"), filepath.Join(cdi, "gpud.io-claim_uid-b.json"), filepath.Join(root, p.StateDir)} {
		if exists(f) {
			t.Errorf("%s left", f)
		}
	}
	if !exists(filepath.Join(cdi, "nvidia.com-gpu.json")) {
		t.Error("NVIDIA's spec removed")
	}
}

// Which claims are prepared is unknown (no checkpoint where --state-dir
// says, or one that cannot be read, or one another user wrote): no spec is
// removed, and the answer says why.
func TestNodeKeepsClaimSpecsWhenUnknown(t *testing.T) {
	for name, spoil := range map[string]func(t *testing.T, ckpt string){
		"no checkpoint": func(t *testing.T, ckpt string) { os.Remove(ckpt) },
		"malformed": func(t *testing.T, ckpt string) {
			if err := os.WriteFile(ckpt, []byte(`{"version":1,"claims":`), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		"another user's": func(t *testing.T, ckpt string) {
			if err := os.Chown(ckpt, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			root, p := claimsNode(t, "uid-a")
			ckpt := filepath.Join(root, p.StateDir, dra.CheckpointFile)
			spoil(t, ckpt)
			var logs testutil.Buffer
			err := Node(p, slog.New(slog.NewTextHandler(&logs, nil)))
			if name == "no checkpoint" {
				if err != nil || !strings.Contains(logs.String(), "without gpud's DRA checkpoint") {
					t.Errorf("error %v, log:\n%s", err, logs.String())
				}
			} else if err == nil || !strings.Contains(err.Error(), "--remove-dra-claims") {
				t.Errorf("error %v, want one naming --remove-dra-claims", err)
			}
			for _, f := range []string{"gpud.io-claim_uid-a.json", "gpud.io-claim_uid-b.json"} {
				if !exists(filepath.Join(root, p.DRACDIDir, f)) {
					t.Errorf("%s removed", f)
				}
			}
			if name != "no checkpoint" && !exists(ckpt) {
				t.Error("the checkpoint removed")
			}
		})
	}
}
