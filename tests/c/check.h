/* The checks the C API's test programs make: each failed check is printed
 * with fulgor's last error and counted in `failures`; the program exits 1
 * when any failed. One program is one translation unit. */
#ifndef FULGOR_TESTS_C_CHECK_H
#define FULGOR_TESTS_C_CHECK_H

#include <stdio.h>
#include <string.h>

#include "fulgor/c/fulgor.h"

static int failures = 0;

#define CHECK(condition)                                                                            \
  do {                                                                                              \
    if (!(condition)) {                                                                             \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #condition, \
              fulgor_last_error());                                                                 \
      ++failures;                                                                                   \
    }                                                                                               \
  } while (0)

/* The call returns `status` and its message mentions `words`. */
#define CHECK_ERROR(call, status, words)                 \
  do {                                                   \
    fulgor_status got = (call);                          \
    CHECK(got == (status));                              \
    CHECK(strstr(fulgor_last_error(), (words)) != NULL); \
  } while (0)

/* Reads `bytes` bytes of folder/name (tests/c/multiarg_model.py's files) into `out`. */
static inline void read_file(const char* folder, const char* name, void* out, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", folder, name);
  FILE* f = fopen(path, "rb");
  CHECK(f != NULL);
  if (f == NULL) return;
  CHECK(fread(out, 1, bytes, f) == bytes);
  fclose(f);
}

#endif
