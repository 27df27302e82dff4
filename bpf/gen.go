package bpf

// Objects for both architectures GPU nodes run (x86-64, and arm64 for Grace
// nodes); `make check-generate` rebuilds them and fails when the committed
// ones differ from what the C source gives.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target amd64,arm64 -type event -type gpu_pol -type gpu_dev gpud gpud.bpf.c -- -I./headers
