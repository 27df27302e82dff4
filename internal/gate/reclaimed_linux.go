package gate

// Reclaimed is the reclaimer's hook (executor.Reclaimer's Done) for the
// workload key: a reclaimed workload's waiting requests go with it; a
// failed reclaim is warned of and its requests stay.
func (c *Controller) Reclaimed(key string, err error) {
	if err != nil {
		c.Log.Warn("reclaim failed", "workload", key, "error", err)
		return
	}
	c.DropWaiters(key)
}
