/* status.c - names and messages of the vram_status codes, generated from VRAM_STATUS_LIST. */
#include "vramkit.h"

const char *vram_strerror(int status) {
  switch (status) {
#define VRAM_X_TEXT(name, value, text) case name: return text;
    VRAM_STATUS_LIST(VRAM_X_TEXT)
#undef VRAM_X_TEXT
  }
  return "unknown status";
}

const char *vram_errname(int status) {
  switch (status) {
#define VRAM_X_NAME(name, value, text) case name: return #name;
    VRAM_STATUS_LIST(VRAM_X_NAME)
#undef VRAM_X_NAME
  }
  return "VRAM_UNKNOWN";
}
