package sharing

import "testing"

// No share book: the daemon's Enforcer is nil, and its counters read 0.
func TestNilEnforcerCounters(t *testing.T) {
	var e *Enforcer
	if e.Overs() != 0 || e.Preemptions() != 0 {
		t.Fatal("a nil enforcer counted")
	}
	e.Kick()
}
