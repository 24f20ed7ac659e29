// The standalone `memfit` program; see run.cpp.
#include <string>
#include <vector>

#include "memfit/cli/run.h"

int main(int argc, char** argv) {
  return memfit::cli::run(std::vector<std::string>(argv + 1, argv + argc));
}
