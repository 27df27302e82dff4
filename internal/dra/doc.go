// Package dra is gpud's DRA kubelet plugin (driver gpud.io): it publishes
// this node's shared GPUs as a ResourceSlice, each with its memory as a
// consumable capacity, and prepares the claims allocated on them (a CDI
// device for the GPU, the memory limit as environment) into the share
// book, checkpointed so that restarts of gpud or kubelet lose nothing.
package dra
