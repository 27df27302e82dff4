package main

// goals is every figure `make bench` judges or reports, one line each:
//
//	{ID, benchmark, unit, bound, what}
//
// ID is the row's name in docs/benchmarks.md's notes (several lines may
// share one); benchmark is the name `go test -bench` prints, without its
// -GOMAXPROCS suffix (sub-benchmarks as Name/sub); unit is the unit the
// benchmark gives b.ReportMetric. The bound is one of
//
//	atMost(1)                 the figure ≤ 1
//	atLeast(100000)           the figure ≥ 100 000
//	atMostTimes(1.1, "unit")  the figure ≤ 1.1 × another figure of the same
//	                          benchmark in the same run (its baseline)
//	reported()                shown, not judged
//
// Adding a goal is adding a line here (docs/development.md); `make bench`
// then judges it in every run and writes it into docs/benchmarks.md. A goal
// whose benchmark ran but did not report its unit fails `-strict` (the
// benchmark and this table disagree).
var goals = []goal{
	{"a1", "BenchmarkOpenOverhead/devnull", "ratio", atMost(1.02), "open+close of /dev/null, with gpud / without"},
	{"a2", "BenchmarkOpenOverhead/regular", "ratio", atMost(1.02), "open+close of a regular file, with gpud / without"},
	{"b1", "BenchmarkOpenToLedger", "µs-ledger-p99", atMost(1000), "GPU open → holder in the ledger, p99"},
	{"b1", "BenchmarkOpenToLedger", "µs-ledger-p50", reported(), "GPU open → holder in the ledger, p50"},
	{"b2", "BenchmarkOpenToLedger", "µs-statefile-p99", atMost(5000), "GPU open → holder in the state file, p99"},
	{"c", "BenchmarkEventThroughput", "pairs/s-paced", atLeast(100000), "open/close pairs processed, paced at the goal's rate"},
	{"c", "BenchmarkEventThroughput", "drops-paced", atMost(0), "events dropped, paced"},
	{"c", "BenchmarkEventThroughput", "pairs/s-processed-with-gpud", reported(), "pairs/s at full speed, gpud attached"},
	{"c", "BenchmarkEventThroughput", "drops", reported(), "events dropped at full speed"},
	{"d", "BenchmarkPreemptLatency", "ms-p99-gpud-part", atMost(1), "gpud's part of a kill: open → victims signalled, p99"},
	{"d", "BenchmarkPreemptLatency", "ms-p99", atMostTimes(1.1, "ms-p99-bare"), "open → both victims dead, p99, vs a bare C SIGKILL"},
	{"d", "BenchmarkPreemptLatency", "ms-p99", atMost(5), "open → both victims dead, p99"},
	{"d", "BenchmarkPreemptLatency", "µs-p50", reported(), "open → both victims dead, p50"},
	{"d", "BenchmarkPreemptLatency", "ms-p99-bare", reported(), "the same victims SIGKILLed by a bare C program → dead, p99"},
	{"d′", "BenchmarkPreemptLatencyCheckpoints", "ratio-p50-to-without", reported(), "kill with checkpoint notices / without, p50"},
	{"e", "BenchmarkGateCost", "ratio", reported(), "GPU open+close: enforcing / observing"},
	{"e′", "BenchmarkGateCost", "ratio-total", reported(), "GPU open+close: enforcing / no gpud"},
	{"f", "BenchmarkGateRace", "violations", atMost(0), "low opens completed while a high holder held the GPU"},
	{"f", "BenchmarkGateRace", "%-refused-while-high-held", atLeast(100), "first low opens refused while a high holder held the GPU, %"},
	{"g", "BenchmarkLendHealth", "ms-busy-p99", atMost(50), "GPU busy → new health on ListAndWatch, p99"},
	{"g", "BenchmarkLendHealth", "ms-lendable-p99", atMost(50), "GPU lendable → new health on ListAndWatch, p99"},
	{"h", "BenchmarkFootprint", "MiB-rss", atMost(50), "idle gpud's RSS, ≈2 080 processes"},
	{"h", "BenchmarkFootprint", "%cpu", atMost(0.2), "idle gpud's CPU, % of a core"},
	{"i", "BenchmarkRejudgeLatency", "µs-class-to-dead-p99", reported(), "class arrives (low) → holder dead, p99"},
	{"j", "BenchmarkSyscallTax", "ratio-getppid-driver", atMost(1.02), "getppid, gpud --hooks driver / none"},
	{"j", "BenchmarkSyscallTax", "ratio-read-driver", atMost(1.02), "1-byte read, gpud --hooks driver / none"},
	{"j", "BenchmarkSyscallTax", "ratio-pipe-driver", atMost(1.02), "pipe write+read, gpud --hooks driver / none"},
	{"j", "BenchmarkSyscallTax", "ratio-openclose-driver", atMost(1.02), "open+close, gpud --hooks driver / none"},
	{"j", "BenchmarkSyscallTax", "ratio-getppid-syscalls", reported(), "getppid, gpud --hooks syscalls / none"},
	{"j", "BenchmarkSyscallTax", "ratio-openclose-syscalls", reported(), "open+close, gpud --hooks syscalls / none"},
	{"j", "BenchmarkSyscallTax", "kprobes-driver", reported(), "kprobes --hooks driver attached (0: the kernel has none)"},
	{"k", "BenchmarkPrepareClaim", "ratio", reported(), "DRA prepare+unprepare / two durable writes"},
	{"l", "BenchmarkPublishAfterHealthChange", "ratio", reported(), "health change → ResourceSlice / a direct update"},
	{"m", "BenchmarkFreezeLatency", "ms-p99-gpud-part", atMost(1), "gpud's part of a freeze: open → cgroup.freeze written, p99"},
	{"m", "BenchmarkFreezeLatency", "ms-p99", atMostTimes(1.1, "ms-p99-bare"), "decision → frozen, p99, vs a bare C freeze"},
	{"m", "BenchmarkFreezeLatency", "µs-p99-decision-to-frozen", atMost(5000), "decision → frozen, p99"},
	{"m", "BenchmarkFreezeLatency", "ms-p99-bare", reported(), "the same cgroup frozen by a bare C program (SCHED_FIFO 1, on a high open): write → frozen, p99"},
	{"m", "BenchmarkFreezeLatency", "ratio-open-to-frozen-p99-to-bare", reported(), "open → frozen p99, gpud / the bare C program, seen alike"},
	{"n", "BenchmarkPreempt200", "ms-p99", atMost(50), "one open → 200 victims dead, p99"},
	{"n", "BenchmarkPreempt200", "ratio-p50-to-bare-kill", reported(), "200 victims, p50 / the same killed directly"},
	{"n", "BenchmarkPreempt200", "ms-p99-bare-kill", reported(), "200 such processes SIGKILLed by a bare C program → dead, p99"},
	{"o", "BenchmarkProcFSScanAll", "ns/op", reported(), "a full /proc scan"},
	{"p", "BenchmarkBigNode", "µs-ledger-p99", atMost(1000), "big node (8 GPUs × 64 holders, 10 000 pairs/s): open → ledger, p99"},
	{"p", "BenchmarkBigNode", "µs-ledger-p99-churn-stopped", reported(), "big node: open → ledger, p99, churn stopped (baseline)"},
	{"p", "BenchmarkBigNode", "µs-statefile-p99", atMost(5000), "big node: open → state file written, p99"},
	{"p", "BenchmarkBigNode", "ms-p99-kill", atMostTimes(1.1, "ms-p99-kill-bare"), "big node: open → both victims dead, p99, vs a bare C SIGKILL"},
	{"p", "BenchmarkBigNode", "pairs/s-churn", atLeast(9500), "big node: open/close pairs the generator made a second"},
	{"p", "BenchmarkBigNode", "MiB-rss", atMost(60), "big node: gpud's RSS, --docker-host none"},
	{"p", "BenchmarkBigNode", "MiB-rss-docker", atMost(60), "big node: gpud's RSS with its Docker client and events"},
	{"p", "BenchmarkBigNode", "%cpu-idle", atMost(0.1), "big node idle: gpud's CPU, % of a core, --docker-host none"},
	{"p", "BenchmarkBigNode", "%cpu-idle-docker", atMost(0.1), "big node idle: gpud's CPU, % of a core, with Docker"},
	{"p", "BenchmarkBigNode", "%cpu-idle-hooks-syscalls", reported(), "big node idle, --hooks syscalls (no holders' 2 s re-read)"},
	{"p", "BenchmarkBigNode", "%cpu-churn", reported(), "big node: gpud's CPU under the churn, % of a core"},
	{"q", "BenchmarkComputeShare", "s-converge-max", atMost(5), "compute shares 10/20/30/40 busy: last pod started → all ±3 points over 1 s, worst round"},
	{"q", "BenchmarkComputeShare", "s-converge", reported(), "compute shares: last pod started → all ±3 points over 1 s, median"},
	{"q", "BenchmarkComputeShare", "points-max-10s", atMost(3), "compute shares: worst |share − target| over 10 s windows"},
	{"q", "BenchmarkComputeShare", "points-max-1s", atMost(5), "compute shares: worst |share − target| over 1 s windows"},
	{"q", "BenchmarkComputeShare", "points-mae-10s", reported(), "compute shares: mean |share − target| over 10 s windows"},
	{"q", "BenchmarkComputeShare", "points-mae-1s", reported(), "compute shares: mean |share − target| over 1 s windows"},
	{"q", "BenchmarkComputeShare", "ops/s", reported(), "compute shares: the scheduler's freezes and thaws a second"},
	{"q", "BenchmarkComputeShare", "%cpu", atMost(1), "compute shares: gpud's CPU, 4 sharing pods, % of a core"},
	{"q", "BenchmarkComputeShare", "%cpu-baseline", reported(), "the same gpud and pods on memory-only shares (baseline)"},
	{"q", "BenchmarkComputeShare", "%cpu-scheduler", reported(), "compute shares: %cpu − %cpu-baseline (the scheduler's own)"},
}
