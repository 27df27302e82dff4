package gate

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
)

// Attach loads and attaches the kernel programs (the gate and the
// observers that feed it) for gpus; gpud itself is registered, and its own
// cgroup exempt from the gate unless it is the root, which would exempt the
// host. A GPU the gate cannot protect is said, and shown as not enforced
// (Monitor.Protected). keep leaves the pinned gate attached when gpud stops.
func Attach(opts bpf.Options, gpus []occupancy.GPU, monitoring, keep bool, log *slog.Logger) (*bpf.Monitor, error) {
	devs := map[uint32]uint32{}
	for _, g := range gpus {
		if len(g.Aliases) > 0 {
			log.Warn("device nodes of one GPU merged", "gpu", g.Index, "device", g.Device, "aliases", g.Aliases)
		}
		if dev, ok := bpf.KernelDev(g.Major, g.Minor); ok {
			devs[dev] = uint32(g.Index)
		}
	}
	selfCgroup := uint64(0)
	if info, err := cgroups.ReadProc(os.Getpid()); err == nil && info.V2Path != "/" && info.V2Path != "" {
		if id, err := cgroups.ID(filepath.Join(opts.CgroupRoot, info.V2Path)); err == nil {
			selfCgroup = id
		}
	}
	mon, err := bpf.Setup(opts, devs, monitoring, uint32(os.Getpid()), selfCgroup)
	if errors.Is(err, bpf.ErrUnprotected) {
		log.Error("GPUs the gate cannot protect: their opens are not judged", "error", err)
		err = nil
	}
	if err == nil {
		mon.KeepGate(keep)
		if gerr := mon.GateErr(); gerr != nil {
			// Monitoring, lending and the after-the-fact rules go on: only
			// the refusals at open time are lost.
			log.Error("observe-only: "+gerr.Error()+": no GPU open is refused, the rules are applied after the fact", "error", gerr)
		}
	}
	return mon, err
}
