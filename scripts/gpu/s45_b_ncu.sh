#!/usr/bin/env bash
# Session 45, one H100, call B (carry .whl): Nsight Compute on the decode attention kernel at batch 256 x 1024
# context: bf16 (ptxas' choice), fp8 with fp16 dots at its best config and at 64 keys capped to 128 registers.
# What bounds fp8 at ~2.1 TB/s where bf16 reads ~2.85: stall reasons, issue slots, occupancy, L1/shared traffic.
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
run() {   # name, then the target's arguments
  local name=$1; shift
  timeout 150 $NCU --clock-control none --kernel-name regex:paged_attention_kernel --launch-skip 2 --launch-count 1 \
    --set full --import-source no -o $OUT/$name python3 scripts/ncu_attention_target.py "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?"
  $NCU --import $OUT/$name.ncu-rep --page details --csv > $OUT/$name-details.csv 2>>$OUT/$name.log
  $NCU --import $OUT/$name.ncu-rep --page raw --csv > $OUT/$name-raw.csv 2>>$OUT/$name.log
  rm -f $OUT/$name.ncu-rep
}
run bf16 bf16 16,64,4,2,512,16
run fp8-128 fp8 16,128,4,2,512,16
run fp8-64-cap128 fp8 16,64,4,2,512,16 --maxnreg 128
run fp8-64 fp8 16,64,4,2,512,16
at "done"
for f in $OUT/*-details.csv; do echo "== $f"; grep -E '"(Duration|Memory Throughput|DRAM Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued Instruction|Executed Ipc Active|L1/TEX Hit Rate|Block Limit Registers|Block Limit Shared Mem)"' $f | awk -F'","' '{print $(NF-2)" = "$NF}' | head -20; done
