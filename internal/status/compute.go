package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// renderComputeShares writes the pods sharing a GPU's compute: target,
// measured share, throttled time, and the scheduler's state (FROZEN while
// it holds the pod frozen); -o wide adds the pod's UID and why.
func renderComputeShares(w io.Writer, gpus []v1.StateGPU, wide bool) error {
	n := 0
	for _, g := range gpus {
		n += len(g.ComputeShares)
	}
	if n == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nGPU COMPUTE SHARES\n")
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "GPU\tPOD\tPOD UID\tTARGET\tUSED\tTHROTTLED\tSTATE\tWHY")
	} else {
		fmt.Fprintln(tw, "GPU\tPOD\tTARGET\tUSED\tTHROTTLED\tSTATE")
	}
	for _, g := range gpus {
		for _, c := range g.ComputeShares {
			pod := c.PodNamespace + "/" + c.PodName
			if wide {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, printable(pod), orDash(printable(c.PodUID)), computeTarget(c),
					computeUsed(c), computeThrottled(c), computeState(c), orDash(printable(c.Why)))
				continue
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", g.Index, trunc(pod, 28), computeTarget(c), computeUsed(c), computeThrottled(c), computeState(c))
		}
	}
	return tw.Flush()
}

// computeTarget is a compute share's target as the tables show it: "30%",
// "30% cap" for a hard cap.
func computeTarget(c v1.StateComputeShare) string {
	if c.HardCap {
		return fmt.Sprintf("%d%% cap", c.TargetPercent)
	}
	return fmt.Sprintf("%d%%", c.TargetPercent)
}

// computeUsed is its measured share: "28.5%".
func computeUsed(c v1.StateComputeShare) string { return fmt.Sprintf("%.1f%%", c.UsedPercent) }

// computeThrottled is its throttled time, to the tenth of a second.
func computeThrottled(c v1.StateComputeShare) string {
	return (time.Duration(c.ThrottledSeconds*10) * time.Second / 10).String()
}

// computeState is the scheduler's state, FROZEN appended while it holds
// the pod frozen.
func computeState(c v1.StateComputeShare) string {
	s := orDash(printable(c.State))
	if c.Frozen {
		s += " FROZEN"
	}
	return s
}

// explainCompute is the line of `gpud explain` on a pod's compute share
// of one GPU.
func explainCompute(b *strings.Builder, c *v1.StateComputeShare) {
	fmt.Fprintf(b, "  compute: target %s, used %s, throttled %s; ", computeTarget(*c), computeUsed(*c), computeThrottled(*c))
	if c.Frozen {
		b.WriteString("FROZEN by the compute scheduler now: ")
	} else {
		fmt.Fprintf(b, "%s, not frozen by the compute scheduler: ", orDash(printable(c.State)))
	}
	fmt.Fprintf(b, "%s\n", orDash(printable(c.Why)))
}
