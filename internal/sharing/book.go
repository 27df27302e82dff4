// Package sharing is the record of GPU memory shares (which pods were
// given how much of which GPU, by DRA claims) and the rule that judges a
// pod's GPU memory against its share.
package sharing

import (
	"slices"
	"strings"
	"sync"
)

// PodRef names a pod a claim is reserved for.
type PodRef struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// Share is one device of one prepared claim: part of one GPU's memory
// given to the pods the claim is reserved for.
type Share struct {
	ClaimUID       string `json:"claim_uid"`
	ClaimNamespace string `json:"claim_namespace"`
	ClaimName      string `json:"claim_name"`
	Request        string `json:"request"` // the claim's request this device answers
	// GPU is gpud's index of the GPU (N of /dev/nvidiaN); UUID its NVML
	// UUID (the DRA device's uuid attribute).
	GPU  int    `json:"gpu"`
	UUID string `json:"uuid"`
	// Bytes is the memory the scheduler allocated to the claim on the GPU
	// (its consumed capacity).
	Bytes uint64 `json:"bytes"`
	// Compute is the percent of the GPU's compute the scheduler allocated
	// to the claim (its consumed "compute" capacity); 0 when it asked none.
	Compute int `json:"compute,omitempty"`
	// HardCap: the claim asked never to get more than Compute, even when
	// the rest of the GPU is idle (else unused compute goes to sharers
	// that want it).
	HardCap bool     `json:"hard_cap,omitempty"`
	Pods    []PodRef `json:"pods"`
}

// Book is the set of shares of this node's prepared claims, keyed by
// claim UID. It is safe for concurrent use; every change calls the change
// hook.
type Book struct {
	mu       sync.Mutex
	byClaim  map[string][]Share
	onChange func()
}

// NewBook returns an empty book.
func NewBook() *Book { return &Book{byClaim: map[string][]Share{}} }

// OnChange sets the function called after every change (without the
// book's lock held).
func (b *Book) OnChange(f func()) {
	b.mu.Lock()
	b.onChange = f
	b.mu.Unlock()
}

// Set records the shares of claim uid, replacing what it had.
func (b *Book) Set(uid string, shares []Share) {
	b.mu.Lock()
	b.byClaim[uid] = slices.Clone(shares)
	f := b.onChange
	b.mu.Unlock()
	if f != nil {
		f()
	}
}

// Remove forgets claim uid's shares.
func (b *Book) Remove(uid string) {
	b.mu.Lock()
	_, had := b.byClaim[uid]
	delete(b.byClaim, uid)
	f := b.onChange
	b.mu.Unlock()
	if had && f != nil {
		f()
	}
}

// Shares returns every share, ordered by GPU, then claim namespace and
// name, then request.
func (b *Book) Shares() []Share {
	b.mu.Lock()
	var out []Share
	for _, s := range b.byClaim {
		out = append(out, s...)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(a, c Share) int {
		if a.GPU != c.GPU {
			return a.GPU - c.GPU
		}
		if n := strings.Compare(a.ClaimNamespace+"/"+a.ClaimName, c.ClaimNamespace+"/"+c.ClaimName); n != 0 {
			return n
		}
		return strings.Compare(a.Request, c.Request)
	})
	return out
}

// OnGPU returns the shares of GPU gpu.
func (b *Book) OnGPU(gpu int) []Share {
	var out []Share
	for _, s := range b.Shares() {
		if s.GPU == gpu {
			out = append(out, s)
		}
	}
	return out
}
