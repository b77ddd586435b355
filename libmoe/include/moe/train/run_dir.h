// A training run's output directory holds one run only. moe-train (and moe-distill) write
// DIR/step-<8 digits>.h5 (or DIR/step-<8 digits>/ when sharded) and move DIR/last.h5 (DIR/last) to
// the newest: two runs in one directory would overwrite each other's same-numbered steps and move
// each other's `last`.
#pragma once
#include <string>
#include <vector>

namespace moe::train {

// The checkpoints of a run found in `dir` (file and directory names: last.h5, last,
// step-<8 digits>.h5, step-<8 digits>), sorted; empty when `dir` is missing or holds none.
std::vector<std::string> run_checkpoints(const std::string& dir);

// Refuses (moe::Error) to start a run in a directory that holds another run's checkpoints.
// "Another run" is any checkpoint in `dir` unless this run resumes from a checkpoint inside `dir`
// itself (`resume` is DIR/last.h5, DIR/step-N.h5, or a sharded DIR/step-N or DIR/last): a run
// started afresh, or resumed from a checkpoint elsewhere, would mix its steps with those already
// there. The message names `--resume DIR/last.h5` (DIR/last when sharded; only when `resumable`,
// the tool having --resume) and `--force`; `force` skips the check.
void check_run_directory(const std::string& dir, const std::string& resume, bool force,
                         bool resumable = true);

}  // namespace moe::train
