"""Prints what scripts/gpu/all_reduce_norm_gpus.py wrote, one line per row.

  python scripts/gpu/arn_summary.py FILE.json"""
import json
import sys

d = json.load(open(sys.argv[1]))
print("world", d.get("world_size"), d.get("device"), "slab", d.get("table_slab_bytes"), "two-shot from rows",
      d.get("table_two_shot_rows"))
for row in d.get("correct", []):
    print(" correct", row["tokens"], "peer" if row["peer_path"] else "before", "out_err %.3g / %.3g" % (
        row["out_max_err"], row["out_ref_max"]), "res_err %.3g" % row["residual_max_err"],
        "same bits" if row["bits_equal_on_every_rank"] else "BITS DIFFER")
for row in d.get("replays", []):
    print(" replays", row)
for row in d.get("timing", []):
    print(" timing", {k: v for k, v in row.items() if k != "bytes"})
