package config

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

func TestReloadableCheck(t *testing.T) {
	ok := Reloadable{IdleAfter: time.Second, DefaultPriority: v1.Low}
	if err := ok.Check(); err != nil {
		t.Fatalf("valid settings refused: %v", err)
	}
	for _, p := range []v1.Priority{v1.High, v1.Unmanaged} {
		if err := (Reloadable{IdleAfter: time.Second, DefaultPriority: p}).Check(); err != nil {
			t.Errorf("default %s refused: %v", p, err)
		}
	}
	for want, bad := range map[string]Reloadable{
		"idle-after":    {IdleAfter: 0, DefaultPriority: v1.Low},
		"preempt-grace": {IdleAfter: time.Second, DefaultPriority: v1.Low, PreemptGrace: -time.Second},
		"priority":      {IdleAfter: time.Second, DefaultPriority: "urgent"},
	} {
		if err := bad.Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want one naming %s", bad, err, want)
		}
	}
}
