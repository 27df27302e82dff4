package bpf

// Only amd64 objects are built: the arm64 syscall numbers and registers in
// headers/gpud.h are written down but untested.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target amd64 -type event -type gpu_pol gpud gpud.bpf.c -- -I./headers
