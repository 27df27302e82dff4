package bpf

import (
	"testing"

	"github.com/cilium/ebpf"
)

// Both architectures' objects offer the same programs and maps, so an arm64
// (Grace) node runs what an x86-64 node runs: only the syscall registers and
// numbers of headers/gpud.h differ between them. The objects are read as
// files, so this runs on either architecture.
func TestObjectsSameForEveryArch(t *testing.T) {
	x86, err := ebpf.LoadCollectionSpec("gpud_x86_bpfel.o")
	if err != nil {
		t.Fatalf("x86-64 object: %v", err)
	}
	arm, err := ebpf.LoadCollectionSpec("gpud_arm64_bpfel.o")
	if err != nil {
		t.Fatalf("arm64 object: %v", err)
	}
	if len(x86.Programs) == 0 || len(x86.Maps) == 0 {
		t.Fatalf("x86-64 object has %d programs and %d maps", len(x86.Programs), len(x86.Maps))
	}
	if len(arm.Programs) != len(x86.Programs) {
		t.Errorf("arm64 object has %d programs, x86-64 %d", len(arm.Programs), len(x86.Programs))
	}
	for name, p := range x86.Programs {
		q, ok := arm.Programs[name]
		switch {
		case !ok:
			t.Errorf("program %s: missing from the arm64 object", name)
		case q.Type != p.Type || q.AttachType != p.AttachType || q.AttachTo != p.AttachTo || q.SectionName != p.SectionName:
			t.Errorf("program %s: arm64 %v/%v/%q, x86-64 %v/%v/%q", name, q.Type, q.AttachType, q.AttachTo, p.Type, p.AttachType, p.AttachTo)
		}
	}
	if len(arm.Maps) != len(x86.Maps) {
		t.Errorf("arm64 object has %d maps, x86-64 %d", len(arm.Maps), len(x86.Maps))
	}
	for name, m := range x86.Maps {
		n, ok := arm.Maps[name]
		switch {
		case !ok:
			t.Errorf("map %s: missing from the arm64 object", name)
		case n.Type != m.Type || n.KeySize != m.KeySize || n.ValueSize != m.ValueSize || n.MaxEntries != m.MaxEntries:
			t.Errorf("map %s: arm64 %v %d/%d/%d, x86-64 %v %d/%d/%d", name,
				n.Type, n.KeySize, n.ValueSize, n.MaxEntries, m.Type, m.KeySize, m.ValueSize, m.MaxEntries)
		}
	}
}
