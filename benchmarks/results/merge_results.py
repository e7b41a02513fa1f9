import json, sys, glob
from collections import Counter
order = ["sweep-moe-before", "sweep-moe-ssm", "sweep-fixed-rerun", "sweep-ssm-rerun", "sweep-timeout-rerun"]
d = "/work/wt-sweep2/benchmarks/results/"
before, after = {}, {}
for name in order:
    try: lines = open(d + name + ".jsonl").read().splitlines()
    except FileNotFoundError: continue
    for l in lines:
        r = json.loads(l)
        if name == "sweep-moe-before": before[r["arch"]] = r
        after[r["arch"]] = r
for label, res in (("before (first slice, 240 s, no fixes)", before), ("latest per architecture", after)):
    c = Counter(r["outcome"] for r in res.values())
    ran = sum(v for k, v in c.items() if k != "no eager")
    print(label, dict(c), f"match {c['match']}/{ran}")
for a, r in sorted(after.items()):
    if r["outcome"] != "match": print(f"  {a:35s} {r['outcome']:14s} {r['cause'][:150]}")
