// Package bpf holds gpud's kernel programs and their loader.
//
// The C source is gpud.bpf.c; `make generate` compiles it with bpf2go into
// the committed gpud_*_bpfel.{go,o} files, so building gpud needs no clang.
//
// The loader exposes a Monitor: the loaded, attached programs, the ring buffer
// of occupancy events, and the user-space side of the kernel's switch and
// registration (patent claims 2 and 3).
package bpf
