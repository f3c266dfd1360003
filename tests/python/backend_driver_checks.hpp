// backend_driver_checks.hpp - the checks of the C++ programs that drive the PyTorch backend
// on sim (torch_backend_driver.cpp, torch_backend_capture_driver.cpp): a failed check names
// its file, line and condition on stderr and ends the program with status 1.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// The call must raise a c10 error of type E whose message contains `words`.
#define CHECK_THROWS(E, words, call)                                                  \
  do {                                                                                \
    bool thrown_ = false;                                                             \
    try {                                                                             \
      call;                                                                           \
    } catch (const E &e_) {                                                           \
      thrown_ = std::string(e_.what()).find(words) != std::string::npos;              \
      if (!thrown_) std::fprintf(stderr, "unexpected message: %s\n", e_.what());      \
    }                                                                                 \
    CHECK(thrown_);                                                                   \
  } while (0)
