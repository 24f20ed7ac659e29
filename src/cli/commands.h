#pragma once

#include <string>
#include <vector>

namespace memfit::cli {

// Each returns the process exit status: 0 success, 1 usage or input error,
// 2 out of memory.
int profile_command(const std::vector<std::string>& args);

}  // namespace memfit::cli
