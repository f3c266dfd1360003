/* input.c - opening, refilling and closing the decompressed bytes of a trace (input.h).
 *
 * gzread passes a file that is not gzip through unchanged, as `gzip -dcf` does, so a plain
 * text trace reads the same either way. The end of the data is told apart from a corrupt
 * or truncated stream by asking zlib (or the child's exit status) at the end, because a
 * trace cut short would otherwise replay as a shorter, wrong one.
 */
#define _POSIX_C_SOURCE 200809L
#include "trace/input.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "vramkit.h"

#ifdef VRAMKIT_NO_ZLIB
#include <sys/wait.h>
#include <unistd.h>
#else
#include <zlib.h>
#endif

static int input_fail(_vram_trace_input *in, const char *why) {
  snprintf(in->error, sizeof in->error, "%s", why);
  in->finished = -1;
  return _VRAM_TRACE_INPUT_ERROR;
}

#ifdef VRAMKIT_NO_ZLIB
static int open_stream(_vram_trace_input *in, const char *path, char *error, size_t cap) {
  /* Open it here first so that a missing file gets this library's message, not gzip's. */
  FILE *probe = fopen(path, "rb");
  if (!probe) {
    snprintf(error, cap, "%s: cannot open: %s", path, strerror(errno));
    return VRAM_EIO;
  }
  fclose(probe);
  int fds[2];
  if (pipe(fds) != 0) {
    snprintf(error, cap, "%s: pipe: %s", path, strerror(errno));
    return VRAM_EIO;
  }
  pid_t child = fork();
  if (child < 0) {
    close(fds[0]);
    close(fds[1]);
    snprintf(error, cap, "%s: fork: %s", path, strerror(errno));
    return VRAM_EIO;
  }
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execlp("gzip", "gzip", "-dcf", "--", path, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  in->child = child;
  in->pipe = fdopen(fds[0], "rb");
  if (!in->pipe) {
    close(fds[0]);
    waitpid(child, NULL, 0);
    in->child = 0;
    snprintf(error, cap, "%s: fdopen: %s", path, strerror(errno));
    return VRAM_EIO;
  }
  return VRAM_OK;
}

static int read_block(_vram_trace_input *in) {
  size_t got = fread(in->buffer, 1, _VRAM_TRACE_INPUT_BLOCK, in->pipe);
  if (got) return (int)got;
  int status = 0;
  pid_t child = in->child;
  in->child = 0;
  if (ferror(in->pipe) || waitpid(child, &status, 0) < 0 || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    return -1;
  return 0;
}

static const char *stream_error(_vram_trace_input *in) {
  return "gzip could not decompress it (corrupt or truncated, or no gzip installed)";
}

static void close_stream(_vram_trace_input *in) {
  if (in->pipe) fclose(in->pipe);
  if (in->child > 0) waitpid(in->child, NULL, 0);
}
#else
static int open_stream(_vram_trace_input *in, const char *path, char *error, size_t cap) {
  errno = 0;
  gzFile gz = gzopen(path, "rb");
  if (!gz) {
    snprintf(error, cap, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    return VRAM_EIO;
  }
  gzbuffer(gz, 1 << 17);
  in->gz = gz;
  return VRAM_OK;
}

static int read_block(_vram_trace_input *in) {
  int got = gzread((gzFile)in->gz, in->buffer, _VRAM_TRACE_INPUT_BLOCK);
  if (got > 0) return got;
  /* Zero is the end or a corrupt stream: ask which. A truncated file reads as Z_BUF_ERROR. */
  int code = Z_OK;
  gzerror((gzFile)in->gz, &code);
  return got < 0 || code != Z_OK ? -1 : 0;
}

static const char *stream_error(_vram_trace_input *in) {
  int code = Z_OK;
  const char *message = gzerror((gzFile)in->gz, &code);
  if (!message || !*message) return "corrupt gzip data";
  /* zlib puts the path first; the reader's message already starts with it. */
  size_t length = strlen(in->path);
  if (strncmp(message, in->path, length) == 0 && strncmp(message + length, ": ", 2) == 0)
    message += length + 2;
  return message;
}

static void close_stream(_vram_trace_input *in) {
  if (in->gz) gzclose((gzFile)in->gz);
}
#endif

int _vram_trace_input_open(_vram_trace_input *in, const char *path, char *error, size_t cap) {
  memset(in, 0, sizeof *in);
  in->path = path;
  /* A directory opens for reading and fails only at the first read, which would then be
   * reported as data that cannot be decompressed. */
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(error, cap, "%s: cannot open: %s", path, strerror(EISDIR));
    return VRAM_EIO;
  }
  in->buffer = malloc(_VRAM_TRACE_INPUT_BLOCK);
  if (!in->buffer) {
    snprintf(error, cap, "%s: out of host memory", path);
    return VRAM_EHOSTMEM;
  }
  return open_stream(in, path, error, cap);
}

int _vram_trace_input_refill(_vram_trace_input *in) {
  if (in->finished) return in->finished < 0 ? _VRAM_TRACE_INPUT_ERROR : _VRAM_TRACE_INPUT_END;
  int got = read_block(in);
  if (got < 0) {
    char why[200];
    snprintf(why, sizeof why, "cannot decompress: %s", stream_error(in));
    return input_fail(in, why);
  }
  if (got == 0) {
    in->finished = 1;
    return _VRAM_TRACE_INPUT_END;
  }
  in->length = (size_t)got;
  in->position = 1;
  return in->buffer[0];
}

const char *_vram_trace_input_error(const _vram_trace_input *in) { return in->error; }

void _vram_trace_input_close(_vram_trace_input *in) {
  close_stream(in);
  free(in->buffer);
  memset(in, 0, sizeof *in);
}
