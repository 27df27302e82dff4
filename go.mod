module github.com/gpud/gpud

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.49.0
)

require github.com/NVIDIA/go-nvml v0.13.0-1 // indirect

tool github.com/cilium/ebpf/cmd/bpf2go
