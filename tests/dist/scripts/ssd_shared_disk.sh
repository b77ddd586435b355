#!/bin/sh
# moe-train --ep 2 --offload ssd with both ranks' --ssd-dir on one disk that holds the files of one
# rank but not of both (a 200 MiB tmpfs in a private mount namespace): the job is refused before
# any expert file is created, naming the shared file system. Before issue 45 each rank checked
# only its own files against the free space, and both filled the disk file by file until one
# failed. Exit 77 (skipped) where no mount namespace can be made.
mpiexec=$1 train=$2 data=$3 work=$4
rm -rf "$work" && mkdir -p "$work/disk" || exit 1
cd "$work" || exit 1
unshare -m sh -c "mount -t tmpfs -o size=200M tmpfs disk" 2>/dev/null || {
  echo "skipped: cannot mount a small tmpfs in a private mount namespace (unshare -m)"
  exit 77
}
# 5000 experts in each of 2 layers, 2 ranks: 137 MiB of expert files per rank, 273 MiB in all.
unshare -m sh -c "mount -t tmpfs -o size=200M tmpfs disk &&
  { timeout 120 '$mpiexec' -n 2 '$train' --data '$data' --out run --arch mixtral --layers 2 \
      --d-model 16 --heads 2 --kv-heads 1 --d-ff 32 --seq 16 --experts 5000 --moe-every 1 \
      --batch 4 --steps 1 --ep 2 --offload ssd --ssd-dir disk/ssd --host-budget 1MiB --threads 1 \
      -q > log 2>&1; echo \$? > status; find disk -type f | wc -l > files; }"
cat log
status=$(cat status) files=$(cat files)
echo "exit status $status, $files files on the disk"
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { echo "FAIL: the job did not fail cleanly"; exit 1; }
grep -q "the SSD expert tiers of the 2 ranks on this node that share its file system need" log ||
  { echo "FAIL: no message naming the shared file system"; exit 1; }
[ "$files" -eq 0 ] || { echo "FAIL: $files files created before the refusal"; exit 1; }
