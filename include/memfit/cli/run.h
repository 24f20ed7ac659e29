// The memfit command line as a function: what the `memfit` program and the
// Python `memfit` command both run.
#pragma once

#include <string>
#include <vector>

namespace memfit::cli {

// Runs `memfit ARGS...` (ARGS without the program name). Prints to stdout
// and stderr; every error is one line on stderr. Returns the exit status:
// 0 done, 1 bad command line or input, 2 out of memory.
int run(std::vector<std::string> args);

}  // namespace memfit::cli
