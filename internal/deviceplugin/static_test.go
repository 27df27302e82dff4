package deviceplugin

import (
	"slices"
	"testing"
)

func TestPick(t *testing.T) {
	for _, tc := range []struct {
		ordered, must []string
		size          int
		want          []string
	}{
		{[]string{"a", "b", "c"}, nil, 2, []string{"a", "b"}},
		{[]string{"a", "b", "c"}, []string{"c"}, 2, []string{"c", "a"}},
		{[]string{"a", "b"}, []string{"b"}, 1, []string{"b"}},
		{[]string{"a"}, nil, 0, []string{}},
	} {
		if got := Pick(tc.ordered, tc.must, tc.size); !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("Pick(%v, %v, %d) = %v, want %v", tc.ordered, tc.must, tc.size, got, tc.want)
		}
	}
}
