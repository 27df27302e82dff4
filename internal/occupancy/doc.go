// Package occupancy keeps gpud's ledger: which processes (and containers, and
// pods) hold each GPU, fed by the kernel's events and reconciled against
// /proc; it derives each GPU's state (free, busy, idle) and renders the
// ledger to the state file, the patent's "preset file".
package occupancy
