package dra

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
)

func podUIDs(shares []sharing.Share) [][]string {
	var out [][]string
	for _, s := range shares {
		var uids []string
		for _, p := range s.Pods {
			uids = append(uids, p.UID)
		}
		out = append(out, uids)
	}
	return out
}

// #32 class 5: two pods reference one ResourceClaim. kubelet prepares it
// once, for the first; the second appears only in the claim's
// status.reservedFor. Both get the claim's share (the book, the
// checkpoint), as the claim changes and after a restart.
func TestTwoPodsOnOneClaimBothGetTheShare(t *testing.T) {
	state, cdi := dirs(t)
	c := claim("shared", "u1", strings.ToLower(uuid0), "4Gi")
	d, cs := newDriver(t, state, cdi, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare: %v %+v", err, res)
	}
	if got := podUIDs(d.cfg.Book.Shares()); !slices.Equal(got[0], []string{"pod-uid-u1"}) {
		t.Fatalf("pods %v after the first prepare", got)
	}
	go d.WatchClaims(ctx)

	// The scheduler reserves the claim for a second pod; kubelet does not
	// ask the driver again.
	c2 := c.DeepCopy()
	c2.Status.ReservedFor = append(c2.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "second", UID: "pod-uid-second"})
	if _, err := cs.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, c2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"pod-uid-u1", "pod-uid-second"}
	testutil.Eventually(t, 10*time.Second, "the second pod given the share", func() bool {
		got := podUIDs(d.cfg.Book.Shares())
		return len(got) == 1 && slices.Equal(got[0], want)
	})
	sh := d.cfg.Book.Shares()[0]
	if sh.Pods[1].Name != "second" || sh.Pods[1].Namespace != "ns" || sh.GPU != 0 || sh.Bytes != 4<<30 {
		t.Errorf("share %+v", sh)
	}

	// The first pod's reservation dropped (it ended): the second keeps its
	// share, the first stays named while the claim is prepared.
	c3 := c2.DeepCopy()
	c3.Status.ReservedFor = c3.Status.ReservedFor[1:]
	if _, err := cs.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, c3, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := podUIDs(d.cfg.Book.Shares()); !slices.Equal(got[0], want) {
		t.Errorf("pods %v after the first pod's reservation went, want %v", got, want)
	}

	// A claim not prepared here is ignored.
	other := claim("other", "u2", strings.ToLower(uuid1), "2Gi")
	if _, err := cs.ResourceV1().ResourceClaims("ns").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(d.cfg.Book.Shares()); n != 1 {
		t.Errorf("%d shares, want the prepared claim's only", n)
	}

	// Restarted: the checkpoint has both pods.
	d2, _ := newDriver(t, state, cdi)
	if got := podUIDs(d2.cfg.Book.Shares()); len(got) != 1 || !slices.Equal(got[0], want) {
		t.Errorf("pods %v after a restart, want %v", got, want)
	}
	// kubelet asking again with the claim as it is now (some versions do):
	// the same answer, the pods merged.
	c4 := c2.DeepCopy()
	c4.Status.ReservedFor = append(c4.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "third", UID: "pod-uid-third"})
	if res, err := d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c4}); err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare again: %v %+v", err, res)
	}
	if got := podUIDs(d2.cfg.Book.Shares()); !slices.Equal(got[0], append(slices.Clone(want), "pod-uid-third")) {
		t.Errorf("pods %v after kubelet asked again for a third pod", got)
	}
	b, _ := json.Marshal(d2.cfg.Book.Shares())
	t.Logf("shares %s", b)
}
