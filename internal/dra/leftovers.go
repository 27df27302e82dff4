package dra

import (
	"slices"
	"strings"

	"github.com/gpud/gpud/internal/safefs"
)

// PreparedClaim is a claim that the checkpoint says is prepared on this
// node: its pods' containers are started with its CDI spec.
type PreparedClaim struct {
	UID, Namespace, Name string
}

// ReadPrepared reads the checkpoint in dir (gpud's state directory): the
// claims prepared, by UID; an error wrapping fs.ErrNotExist when there is
// no checkpoint. For `gpud uninstall`, which must not take a running pod's
// CDI spec away.
func ReadPrepared(dir *safefs.Dir) ([]PreparedClaim, error) {
	c, err := readCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	out := make([]PreparedClaim, 0, len(c.Claims))
	for uid, r := range c.Claims {
		out = append(out, PreparedClaim{UID: uid, Namespace: r.Namespace, Name: r.Name})
	}
	slices.SortFunc(out, func(a, b PreparedClaim) int { return strings.Compare(a.UID, b.UID) })
	return out, nil
}

// ClaimSpecUID reports whether name is a claim's CDI spec file as gpud
// names them in the CDI directory, and the claim's UID.
func ClaimSpecUID(name string) (string, bool) {
	uid, ok := strings.CutPrefix(name, cdiPrefix)
	if !ok {
		return "", false
	}
	uid, ok = strings.CutSuffix(uid, cdiSuffix)
	if !ok || uid == "" || strings.Contains(uid, "/") {
		return "", false
	}
	return uid, true
}
