// Package v1 holds the wire formats other tools read from gpud: the state
// file, the preemption record (journal and state file), the answer of the
// control socket's explain call, and a client for that socket. It depends on
// the standard library only, so that a consumer imports none of gpud's
// internals. Field names and JSON keys are contracts (DESIGN.md).
package v1
