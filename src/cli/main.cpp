// The standalone `memfit` program; see run.cpp.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "memfit/cli/run.h"

namespace {

// `memfit explain` and `memfit doctor` are Python's (python/memfit/command.py).
// Built beside the Python package, the program hands them to the Python it
// was built with, the build's package first on its path; returns only when
// that Python cannot be run (run() then says where the commands live).
void run_in_python(int argc, char** argv) {
#ifdef MEMFIT_PYTHON
  const std::string command = argc > 1 ? argv[1] : "";
  if (command != "explain" && command != "doctor") return;
  std::string path = MEMFIT_PYTHON_PATH;
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') {
    path += std::string(":") + old;
  }
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<char*> args = {const_cast<char*>(MEMFIT_PYTHON), const_cast<char*>("-m"),
                             const_cast<char*>("memfit")};
  args.insert(args.end(), argv + 1, argv + argc);
  args.push_back(nullptr);
  execv(MEMFIT_PYTHON, args.data());
#else
  (void)argc;
  (void)argv;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  run_in_python(argc, argv);
  return memfit::cli::run(std::vector<std::string>(argv + 1, argv + argc));
}
