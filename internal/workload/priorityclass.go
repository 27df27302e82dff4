package workload

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpud/gpud/internal/occupancy"
)

// PriorityClasses maps a pod's priority (spec.priority, the value of its
// PriorityClass, as the scheduler's preemption reads it) to gpud's class:
// --priority-classes, the operator's. Empty: no priority is mapped and
// the label alone decides.
type PriorityClasses []PriorityRange

// PriorityRange is one entry: pods whose priority compares with Value as
// Op says are of Class.
type PriorityRange struct {
	Class occupancy.Priority // high or low
	Op    string             // ">=", ">", "<=" or "<"
	Value int64
}

// ParsePriorityClasses parses --priority-classes entries, each
// "<high|low><op><value>" with op one of >=, >, <=, < and value an int32
// (a PriorityClass's range), e.g. "high>=1000", "low<1000". Nothing is
// trimmed.
func ParsePriorityClasses(entries []string) (PriorityClasses, error) {
	var out PriorityClasses
	for _, e := range entries {
		r, err := parsePriorityRange(e)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// CheckPriorityClass checks one --priority-classes entry.
func CheckPriorityClass(e string) error {
	_, err := parsePriorityRange(e)
	return err
}

func parsePriorityRange(e string) (PriorityRange, error) {
	var r PriorityRange
	rest, ok := "", false
	for _, c := range []occupancy.Priority{occupancy.High, occupancy.Low} {
		if rest, ok = strings.CutPrefix(e, string(c)); ok {
			r.Class = c
			break
		}
	}
	if ok {
		for _, op := range []string{">=", "<=", ">", "<"} { // two-byte operators first
			if v, found := strings.CutPrefix(rest, op); found {
				r.Op = op
				n, err := strconv.ParseInt(v, 10, 32)
				if err == nil {
					r.Value = n
					return r, nil
				}
				break
			}
		}
	}
	if len(e) > 64 {
		e = e[:64] + "…"
	}
	return PriorityRange{}, fmt.Errorf("priority class %q: want high or low, then >=, >, <= or <, then a PriorityClass value (e.g. high>=1000)", e)
}

// Class returns the class of a pod of priority p: the first entry that
// matches, in the order given; false when none does (or p is not known).
func (m PriorityClasses) Class(p *int32) (occupancy.Priority, bool) {
	if p == nil {
		return "", false
	}
	v := int64(*p)
	for _, r := range m {
		var in bool
		switch r.Op {
		case ">=":
			in = v >= r.Value
		case ">":
			in = v > r.Value
		case "<=":
			in = v <= r.Value
		case "<":
			in = v < r.Value
		}
		if in {
			return r.Class, true
		}
	}
	return "", false
}
