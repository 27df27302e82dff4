package workload

// IgnoredLabels counts the workloads whose gpud.io/ labels were ignored,
// by reason: "image" (declared by the container's image, not given to it:
// ImageLabelsDropped), "preempt_mode" (a mode its namespace may not choose:
// ModesRefused).
func (r *Registry) IgnoredLabels() map[string]uint64 {
	return map[string]uint64{"image": r.ImageLabelsDropped.Load(), "preempt_mode": r.ModesRefused.Load()}
}
