package uninstall

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"

	"github.com/gpud/gpud/internal/dra"
	"github.com/gpud/gpud/internal/safefs"
)

// removeClaims removes what gpud's DRA driver left: its checkpoint of
// prepared claims and the claims' CDI specs. Claims still prepared keep
// both unless p.RemoveDRAClaims: a container of their pods that restarts
// is created from its CDI spec, and a gpud installed again takes them over
// from the checkpoint. A spec of a claim that the checkpoint does not list
// (a prepare cut short) goes. Without a checkpoint to say which claims are
// prepared (none written, or --state-dir not gpud's), no spec goes.
func removeClaims(p Paths, log *slog.Logger) error {
	var (
		errs     []error
		claims   []dra.PreparedClaim
		stateDir *safefs.Dir
		recorded bool // the checkpoint was read: it says which claims are prepared
	)
	if p.StateDir != "" {
		d, err := openDir(p.HostRoot, p.StateDir)
		switch {
		case err != nil:
			errs = append(errs, err)
		case d != nil:
			defer d.Close()
			stateDir = d
			claims, err = dra.ReadPrepared(d)
			switch {
			case err == nil:
				recorded = true
			case errors.Is(err, fs.ErrNotExist):
			case !p.RemoveDRAClaims:
				// Unreadable: which specs are in use is unknown, so none goes.
				return fmt.Errorf("uninstall: DRA claims kept (--remove-dra-claims removes them anyway): %w", err)
			}
		}
	}
	keep := map[string]bool{}
	for _, c := range claims {
		keep[c.UID] = !p.RemoveDRAClaims
	}
	var kept []string
	removed := 0
	if p.DRACDIDir != "" {
		d, err := openDir(p.HostRoot, p.DRACDIDir)
		switch {
		case err != nil:
			errs = append(errs, err)
		case d != nil:
			defer d.Close()
			names, err := d.Names(maxEntries)
			if err != nil {
				errs = append(errs, fmt.Errorf("uninstall: %w", err))
			}
			for _, n := range names {
				uid, ok := dra.ClaimSpecUID(n)
				switch {
				case !ok:
				case keep[uid] || !recorded && !p.RemoveDRAClaims:
					kept = append(kept, filepath.Join(p.DRACDIDir, n))
				default:
					if err := d.Remove(n); err != nil {
						errs = append(errs, fmt.Errorf("uninstall: %w", err))
						continue
					}
					removed++
				}
			}
		}
	}
	if removed > 0 {
		log.Info("claim CDI specs removed", "cdi_dir", p.DRACDIDir, "specs", removed)
	}
	ckpt := filepath.Join(p.StateDir, dra.CheckpointFile)
	switch {
	case !recorded && len(kept) > 0:
		log.Warn("claim CDI specs without gpud's DRA checkpoint (is --state-dir gpud run's?): kept, as which are in use is unknown; gpud uninstall --remove-dra-claims removes them",
			"cdi_specs", kept, "checkpoint", ckpt)
	case len(claims) > 0 && !p.RemoveDRAClaims:
		names := make([]string, 0, len(claims))
		for _, c := range claims {
			names = append(names, c.Namespace+"/"+c.Name+" ("+c.UID+")")
		}
		log.Warn("DRA claims still prepared on this node: their checkpoint and CDI specs kept (a restarting container of their pods needs its spec; gpud installed again takes them over); once their pods are gone: gpud uninstall --remove-dra-claims",
			"claims", names, "cdi_specs", kept, "checkpoint", ckpt)
	case stateDir != nil:
		if err := stateDir.Remove(dra.CheckpointFile); err != nil {
			errs = append(errs, fmt.Errorf("uninstall: %w", err))
		}
	}
	return errors.Join(errs...)
}
