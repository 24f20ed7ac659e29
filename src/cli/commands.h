#pragma once

#include <string>
#include <vector>

#include "memfit/torch/models.h"

namespace memfit::cli {

class Args;
// --layers, --width, --heads, --context for the gpt model.
ModelOptions model_options(const Args& args);


// Each returns the process exit status: 0 success, 1 usage or input error,
// 2 out of memory.
int profile_command(const std::vector<std::string>& args);
int fit_command(const std::vector<std::string>& args);
int train_command(const std::vector<std::string>& args);
int advise_command(const std::vector<std::string>& args);

}  // namespace memfit::cli
