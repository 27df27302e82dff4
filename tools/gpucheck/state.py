#!/usr/bin/env python3
"""Queries of gpud's state file and metrics for scripts/gpu-check.sh.

python3 state.py STATE_FILE COMMAND [ARGS]; prints one line, exit 1 when
what was asked is not there. The standard library only: a GPU node has
python3 but maybe not jq.
"""
import json
import sys
import urllib.request


def load(path):
    with open(path) as f:
        return json.load(f)


def bare(uuid):
    """A UUID without its GPU-/MIG- prefix (the probe writes GPU-)."""
    for p in ("GPU-", "MIG-"):
        if uuid.startswith(p):
            return uuid[len(p):]
    return uuid


def main():
    path, cmd, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if cmd == "metric":  # metric URL NAME [LABEL_SUBSTRING]: the sum of the matching samples
        url, name = args[0], args[1]
        sub = args[2] if len(args) > 2 else ""
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name)] in " {" and sub in line:
                total += float(line.rsplit(" ", 1)[1])
        print(int(total) if total == int(total) else total)
        return 0
    s = load(path)
    gpus = s.get("gpus") or []
    if cmd == "holder":  # holder PID: the GPU it holds
        pid = int(args[0])
        for g in gpus:
            for h in g.get("holders") or []:
                if h.get("pid") == pid:
                    print("index=%d uuid=%s memory_bytes=%s priority=%s" % (
                        g["index"], g.get("uuid", ""), h.get("memory_bytes", "none"), h.get("priority", "")))
                    return 0
        return 1
    if cmd == "slice":  # slice PID: the MIG slice it holds, with its place (gpus[].mig)
        pid = int(args[0])
        for g in gpus:
            m = g.get("mig")
            if m and any(h.get("pid") == pid for h in g.get("holders") or []):
                print("index=%d uuid=%s device=%s parent=%d parent_uuid=%s gi=%d ci=%d profile=%s" % (
                    g["index"], g.get("uuid", ""), g.get("device", ""), m.get("parent", -1),
                    m.get("parent_uuid", ""), m.get("gpu_instance", -1), m.get("compute_instance", -1),
                    m.get("profile", "")))
                return 0
        return 1
    if cmd == "slices":  # slices: one line per MIG slice gpud lists
        out = ["uuid=%s parent=%d parent_uuid=%s profile=%s" % (
            g.get("uuid", ""), g["mig"].get("parent", -1), g["mig"].get("parent_uuid", ""), g["mig"].get("profile", ""))
            for g in gpus if g.get("mig")]
        for line in out:
            print(line)
        return 0 if out else 1
    if cmd == "gpu":  # gpu UUID: its index, state, holders
        for g in gpus:
            if g.get("uuid") and bare(g["uuid"]) == bare(args[0]):
                print("index=%d state=%s holders=%d" % (g["index"], g.get("state", ""), len(g.get("holders") or [])))
                return 0
        return 1
    if cmd == "state":  # state INDEX
        for g in gpus:
            if g["index"] == int(args[0]):
                print(g.get("state", ""))
                return 0
        return 1
    if cmd == "holders":  # holders INDEX: how many
        for g in gpus:
            if g["index"] == int(args[0]):
                print(len(g.get("holders") or []))
                return 0
        return 1
    if cmd == "records":  # records ACTION PID: that victim's records, newest last
        found = 0
        for r in s.get("preemptions") or []:
            if r.get("action") == args[0] and (r.get("victim") or {}).get("pid") == int(args[1]):
                print("latency_ms=%s result=%s" % (r.get("latency_ms", ""), r.get("result", "").replace(" ", "_")))
                found += 1
        return 0 if found else 1
    if cmd == "suspended":  # suspended PID: its suspension
        for x in s.get("suspended") or []:
            if int(args[0]) in (x.get("pids") or []):
                print("checkpointed=%s" % ",".join(str(p) for p in x.get("checkpointed") or []))
                return 0
        return 1
    if cmd == "hooks":
        h = s.get("hooks") or {}
        print("mode=%s complete=%s attached=%s missing=%s" % (
            h.get("mode", "none"), str(h.get("complete", False)).lower(),
            ",".join(h.get("attached") or []) or "-",
            # "release (nvidia_close: why; ...)": the hook's name is enough here
            ",".join(m.split(" (")[0] for m in h.get("missing") or []) or "-"))
        return 0
    if cmd == "nvml":  # nvml [INDEX]: the node's NVML, and the GPU's activity source
        n = s.get("nvml") or {}
        src = s.get("activity_source", "")
        for g in gpus:
            if args and g["index"] == int(args[0]):
                src = (g.get("nvml") or {}).get("activity_source", "none")
        print("activity_source=%s driver=%s error=%s" % (
            src, n.get("driver_version", ""), (n.get("error") or "-").replace(" ", "_")))
        return 0
    if cmd == "left-alone":
        out = ["%s:%s:%s" % (x.get("device", ""), x.get("uuid", ""), x.get("reason", "").replace(" ", "_"))
               for x in s.get("left_alone") or []]
        print(" ".join(out))
        return 0 if out else 1
    print("state.py: unknown command " + cmd, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
