package status

import (
	"fmt"
	"path/filepath"

	v1 "github.com/gpud/gpud/api/v1"
)

// gpuName is how `gpud status` names a GPU: N of /dev/nvidiaN, or for a
// MIG slice its parent and GPU instance, "0/gi1" (its index, above every
// /dev/nvidiaN, says nothing to a reader).
func gpuName(g v1.StateGPU) string {
	if m := g.MIG; m != nil {
		return fmt.Sprintf("%d/gi%d", m.Parent, m.GI)
	}
	return fmt.Sprint(g.Index)
}

// migFact says what a MIG slice is: its profile, its parent and the node
// its processes hold ("" for a whole GPU).
func migFact(g v1.StateGPU) string {
	m := g.MIG
	if m == nil {
		return ""
	}
	return fmt.Sprintf("MIG %s of GPU %d, gi%d/ci%d, %s, parent %s", printable(orDash(m.Profile)), m.Parent, m.GI, m.CI,
		printable(filepath.Base(g.Device)), printable(orDash(m.ParentUUID)))
}
