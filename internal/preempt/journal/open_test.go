package journal

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/preempt"
)

func TestOpenStateAndCheckpoints(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	j, ckpt, err := Open(t.TempDir(), "", "", log)
	if err != nil || ckpt != nil {
		t.Fatalf("without a checkpoint root: checkpoints %v, %v; want none", ckpt, err)
	}
	j.Close()

	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "train-42"), 0o755); err != nil { // the old layout
		t.Fatal(err)
	}
	j, ckpt, err = Open(t.TempDir(), root, "/host/ckpt", log)
	if err != nil || ckpt == nil {
		t.Fatalf("with a checkpoint root: %v, %v", ckpt, err)
	}
	defer j.Close()
	if _, err := os.Lstat(filepath.Join(root, LegacyDir, "train-42")); err != nil {
		t.Fatalf("the old layout's directory was not set aside: %v", err)
	}
	if ckpt.Root != root || ckpt.HostRoot != "/host/ckpt" {
		t.Fatalf("checkpoints %+v", ckpt)
	}
	// Its records are the journal's: a kill recorded there gives the
	// task's pod its directory (Mount is For).
	if err := j.Append(preempt.Record{ID: "r1", Action: preempt.ActionKill,
		Victim: preempt.Party{PodUID: "uid-a", Namespace: "ml", TaskID: "train-42"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteNotice(root, Notice{Namespace: "ml", TaskID: "train-42", RecordID: "r1"}); err != nil {
		t.Fatal(err)
	}
	m, ok := ckpt.For("uid-a", "ml", "train-42")
	dir, ro, ok2 := ckpt.Mount("uid-a", "ml", "train-42")
	if !ok || !ok2 || dir != m.Dir || ro != m.ReadOnly || !strings.HasPrefix(dir, "/host/ckpt/") {
		t.Fatalf("mount %q %v %v, For %+v %v", dir, ro, ok2, m, ok)
	}
}

func TestOpenNamesTheSettingAtFault(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(notDir, "", "", log); err == nil || !strings.HasPrefix(err.Error(), "--state-dir: ") {
		t.Fatalf("a bad state dir: %v", err)
	}
	if _, _, err := Open(t.TempDir(), notDir, "", log); err == nil || !strings.HasPrefix(err.Error(), "--checkpoint-root: ") {
		t.Fatalf("a bad checkpoint root: %v", err)
	}
}
