package bpf

import (
	"log/slog"
	"time"
)

// DriverRetryEvery is how often missing driver hooks are tried again.
const DriverRetryEvery = 30 * time.Second

// Upkeep is the kernel side's work of every second: the heartbeat the gate
// fails open without, the driver hooks tried again (DriverRetry, every
// DriverRetryEvery), the kernel maps' use sampled (MapWatch).
type Upkeep struct {
	Monitor *Monitor
	Maps    *MapWatch
	Log     *slog.Logger
	// Changed is called when a driver hook was attached or dropped.
	Changed func()
	retry   *DriverRetry
}

// Tick does the upkeep once, at now.
func (u *Upkeep) Tick(now time.Time) {
	if u.retry == nil {
		u.retry = &DriverRetry{Monitor: u.Monitor, Every: DriverRetryEvery, Log: u.Log}
	}
	if err := u.Monitor.Heartbeat(); err != nil {
		u.Log.Error("heartbeat", "error", err)
	}
	if u.retry.Tick(now) && u.Changed != nil {
		u.Changed()
	}
	u.Maps.Sample(now)
}
