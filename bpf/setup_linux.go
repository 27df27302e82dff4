package bpf

import "errors"

// Setup loads and attaches the programs (Load), then tells them the GPUs
// (kernel device number → GPU index), the monitoring switch, and the
// registered gpud: its own opens (NVML) are exempt from the gate, and so is
// selfCgroup (0 for none: gpud in the root cgroup would exempt the host).
// GPUs the gate cannot protect are no reason to stop: Setup then returns
// the monitor with an error wrapping ErrUnprotected (Protected says which).
func Setup(opts Options, gpus map[uint32]uint32, monitoring bool, self uint32, selfCgroup uint64) (*Monitor, error) {
	m, err := Load(opts)
	if err != nil {
		return nil, err
	}
	unprotected := m.SetGPUs(gpus)
	if unprotected != nil && !errors.Is(unprotected, ErrUnprotected) {
		m.Close()
		return nil, unprotected
	}
	for _, step := range []func() error{
		func() error { return m.SetMonitoring(monitoring) },
		func() error { return m.Register(self, selfCgroup) },
	} {
		if err := step(); err != nil {
			m.Close()
			return nil, err
		}
	}
	return m, unprotected
}
