// A stand-in for c10/util/Exception.h, so that the CPU tests can compile torch_oom.cpp
// without PyTorch. It declares only what torch_oom.cpp uses, in the shape the real header
// gives it: c10::Error built from a source location and a message, c10::OutOfMemoryError
// deriving from it, and the C10_THROW_ERROR macro. The GPU suite (tests/gpu) builds the
// same file against the real header.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace c10 {

struct SourceLocation {
  const char *function;
  const char *file;
  uint32_t line;
};

class Error : public std::exception {
 public:
  Error(SourceLocation where, std::string msg) : where_(where), msg_(std::move(msg)) {}
  const char *what() const noexcept override { return msg_.c_str(); }

 private:
  SourceLocation where_;
  std::string msg_;
};

class OutOfMemoryError : public Error {
  using Error::Error;
};

}  // namespace c10

#define C10_THROW_ERROR(err_type, msg) \
  throw ::c10::err_type({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg)
