package preempt

import (
	"slices"
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

const gib = uint64(1) << 30

// On a shared GPU the opener's class picks the row, whoever holds it, and
// only the high row reaches sharers within their share.
func TestDecideSharedRows(t *testing.T) {
	for _, held := range []Holding{{Shared: true}, {Shared: true, High: true}, {Shared: true, Low: true}} {
		if v := Decide(held, occupancy.High); !v.Allow || v.KillHolders || v.PreemptSharers != SharersLow || v.Rule != RuleSharedHigh {
			t.Errorf("Decide(%+v, high) = %+v", held, v)
		}
		if v := Decide(held, occupancy.Low); !v.Allow || v.ReclaimOpener || v.PreemptSharers != SharersOver || v.Rule != RuleSharedLow {
			t.Errorf("Decide(%+v, low) = %+v", held, v)
		}
		if v := Decide(held, occupancy.Unmanaged); !v.Allow || v.PreemptSharers != "" {
			t.Errorf("Decide(%+v, unmanaged) = %+v", held, v)
		}
	}
}

func TestDecideShared(t *testing.T) {
	hi, lo := occupancy.High, occupancy.Low
	type pick struct {
		i    int
		rule string
	}
	for _, tc := range []struct {
		name    string
		sharers []Sharer
		free    uint64
		need    uint64
		want    []pick
	}{
		{
			name: "the issue's case: low 2 GiB over, GPU full, high needs its share: the over-share low goes, not the in-share one",
			sharers: []Sharer{
				{Key: "a-low-in", Class: lo, Requested: 4 * gib, Used: 4 * gib},
				{Key: "b-low-over", Class: lo, Requested: 4 * gib, Used: 6 * gib},
				{Key: "c-high", Class: hi, Requested: 8 * gib, Used: 6 * gib},
			},
			free: 0, need: 2 * gib,
			want: []pick{{1, RuleSharedHigh}},
		},
		{
			name: "over-share lows are not enough for the high need: then the in-share low, the largest first",
			sharers: []Sharer{
				{Key: "a-low-in-small", Class: lo, Requested: 4 * gib, Used: gib},
				{Key: "b-low-over", Class: lo, Requested: gib, Used: 2 * gib},
				{Key: "c-high", Class: hi, Requested: 8 * gib, Used: 0},
				{Key: "d-low-in-big", Class: lo, Requested: 4 * gib, Used: 4 * gib},
			},
			free: gib, need: 11 * gib,
			want: []pick{{1, RuleSharedHigh}, {3, RuleSharedHigh}, {0, RuleSharedHigh}},
		},
		{
			name: "a low sharer's need takes only over-share lows, never one within its share",
			sharers: []Sharer{
				{Key: "a-low-needs", Class: lo, Requested: 8 * gib, Used: 0},
				{Key: "b-low-over", Class: lo, Requested: gib, Used: 2 * gib},
				{Key: "c-low-in", Class: lo, Requested: 4 * gib, Used: 4 * gib},
			},
			free: gib, need: 8 * gib,
			want: []pick{{1, RuleSharedLow}},
		},
		{
			name: "the high need covered, a low need left: the low row names the choice",
			sharers: []Sharer{
				{Key: "a-high", Class: hi, Requested: 4 * gib, Used: 3 * gib},
				{Key: "b-low-needs", Class: lo, Requested: 8 * gib, Used: 0},
				{Key: "c-low-over", Class: lo, Requested: gib, Used: 3 * gib},
			},
			free: 2 * gib, need: 9 * gib,
			want: []pick{{2, RuleSharedLow}},
		},
		{
			name: "free memory covers every need: nobody",
			sharers: []Sharer{
				{Key: "a-high", Class: hi, Requested: 8 * gib, Used: 0},
				{Key: "b-low-over", Class: lo, Requested: gib, Used: 5 * gib},
			},
			free: 8 * gib, need: 8 * gib,
		},
		{
			name: "high, unmanaged and unclassified sharers and idle lows are never chosen",
			sharers: []Sharer{
				{Key: "a-high", Class: hi, Requested: 8 * gib, Used: 0},
				{Key: "b-high-over", Class: hi, Requested: gib, Used: 4 * gib},
				{Key: "c-unmanaged-over", Class: occupancy.Unmanaged, Requested: gib, Used: 4 * gib},
				{Key: "d-unclassified", Class: occupancy.Unclassified, Requested: gib, Used: gib},
				{Key: "e-low-idle", Class: lo, Requested: 2 * gib, Used: 0},
			},
			free: 0, need: 10 * gib,
		},
		{
			name: "over-share lows largest overage first, ties by key; stops once covered",
			sharers: []Sharer{
				{Key: "b", Class: lo, Requested: gib, Used: 3 * gib},
				{Key: "a", Class: lo, Requested: gib, Used: 3 * gib},
				{Key: "c", Class: lo, Requested: gib, Used: 5 * gib},
				{Key: "d-high", Class: hi, Requested: 8 * gib, Used: 0},
			},
			free: 0, need: 8 * gib,
			want: []pick{{2, RuleSharedHigh}, {1, RuleSharedHigh}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			need, got := DecideShared(tc.sharers, tc.free)
			var picks []pick
			for _, c := range got {
				picks = append(picks, pick{c.Sharer, c.Rule})
			}
			if need != tc.need || !slices.Equal(picks, tc.want) {
				t.Errorf("DecideShared = need %d, %+v; want need %d, %+v", need, picks, tc.need, tc.want)
			}
		})
	}
}
