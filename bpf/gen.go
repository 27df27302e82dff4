package bpf

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target amd64,arm64 -type event -type gpu_pol gpud gpud.bpf.c -- -I./headers
