package workload

import (
	"log/slog"

	"github.com/gpud/gpud/internal/occupancy"
)

// NewRegistry is a registry whose unlabelled workloads are of class def,
// with its system agents, the preempt modes namespaces may choose and the
// --priority-classes entries; an error says which of them is invalid.
func NewRegistry(def occupancy.Priority, agents Agents, modes PreemptModes, priorityClasses []string, log *slog.Logger) (*Registry, error) {
	if err := agents.Check(); err != nil {
		return nil, err
	}
	if err := modes.Check(); err != nil {
		return nil, err
	}
	classes, err := ParsePriorityClasses(priorityClasses)
	if err != nil {
		return nil, err
	}
	return &Registry{Default: def, Agents: agents, Modes: modes, PriorityClasses: classes, Log: log}, nil
}
