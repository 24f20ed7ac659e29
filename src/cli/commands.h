#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/model/report.h"
#include "memfit/torch/models.h"

namespace memfit::cli {

class Args;
// --layers, --width, --heads, --context for the gpt model.
ModelOptions model_options(const Args& args);

// --target cpu|cuda and --cuda-workspace SIZE: the card a budget or an
// estimate is for.
struct CudaTarget {
  bool on = false;  // --target cuda
  int64_t workspace_bytes = kDefaultCudaWorkspaceBytes;
};
CudaTarget cuda_target_of(const Args& args);


// Each returns the process exit status: 0 success, 1 usage or input error,
// 2 out of memory.
int profile_command(const std::vector<std::string>& args);
int fit_command(const std::vector<std::string>& args);
int train_command(const std::vector<std::string>& args);
int advise_command(const std::vector<std::string>& args);

}  // namespace memfit::cli
